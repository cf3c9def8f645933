#!/usr/bin/env bash
# What `make test` needs beyond .venv: Debian's Chromium (the web extension's browser test drives it with Playwright)
# and Node.js (`node --test tests/web/`). Used by `make test` and by .ci/run.
#
# Silent when both are there. Otherwise installs what is missing with apt-get when it can (as root, or with
# password-less `sudo -n`); when it cannot, prints the exact command to run (or how to skip the browser test) and
# exits 1, so that make stops with that message instead of failing the browser tests one by one.
#
#   H3_SKIP_BROWSER=1   the browser test is skipped: Chromium is not needed (Node.js still is)
#   H3_CHROMIUM=PATH    the Chromium binary the browser test uses (default /usr/bin/chromium)
set -u

chromium=${H3_CHROMIUM:-/usr/bin/chromium}
have_chromium() { [ "${H3_SKIP_BROWSER:-0}" = 1 ] || [ -x "$chromium" ]; }
have_node() { command -v node >/dev/null 2>&1; }
have_chromium && have_node && exit 0

say() { printf '[ensure_browser] %s\n' "$*" >&2; }

packages=""
reason=""
if ! have_chromium; then
  packages="chromium"
  reason="the browser test needs Chromium at $chromium"
fi
if ! have_node; then
  packages="${packages:+$packages }nodejs"
  reason="${reason:+$reason; }the web view tests need Node.js (node)"
fi

# Root for apt-get: this user, or password-less sudo.
sudo_cmd=""
can_install=0
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    can_install=1
  elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo_cmd="sudo -n"
    can_install=1
  fi
fi

if [ $can_install = 1 ]; then
  say "$reason: installing $packages with apt-get"
  # shellcheck disable=SC2086  # $sudo_cmd and $packages are word lists
  if $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
     && $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null; then
    have_chromium && have_node && exit 0
    have_chromium || say "apt-get installed chromium, but there is no executable at $chromium:" \
      "set H3_CHROMIUM to the Chromium binary, or skip the browser test with H3_SKIP_BROWSER=1 make test"
    have_node || say "apt-get installed nodejs, but node is still not on PATH"
    exit 1
  fi
  say "apt-get could not install $packages (its error is above)."
else
  say "$reason, and this user cannot install packages (that needs apt-get, and root or password-less sudo)."
fi

# Say exactly what to run.
if command -v apt-get >/dev/null 2>&1; then
  s=""
  [ "$(id -u)" = 0 ] || s="sudo "
  say "Install with:"
  say "    ${s}apt-get update && ${s}apt-get install -y $packages"
else
  say "Install $packages with this system's package manager (there is no apt-get here)."
  have_chromium || say "If Chromium is not at $chromium, set H3_CHROMIUM=/path/to/chromium."
fi
if ! have_chromium; then
  say "or skip the browser test:"
  say "    H3_SKIP_BROWSER=1 make test"
fi
exit 1
