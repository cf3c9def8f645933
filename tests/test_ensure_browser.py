"""scripts/ensure_browser.sh, which `make test` and .ci/run both run before the tests: silent when Chromium and
Node.js are there, installs them with apt-get where it can, and otherwise stops with the exact command to run.

Nothing is installed or removed here: the script runs with PATH set to a folder of stand-ins (``id``, ``apt-get``,
``sudo``, ``node``) and ``H3_CHROMIUM`` pointing into a temporary folder.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ensure_browser.sh"
BASH = shutil.which("bash") or "/bin/bash"


class Sandbox:
    def __init__(self, tmp: pathlib.Path):
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.chromium = tmp / "usr" / "bin" / "chromium"
        self.log = tmp / "apt.log"
        (self.bin / "env").symlink_to(shutil.which("env"))

    def tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text("#!" + BASH + "\n" + body + "\n")
        path.chmod(0o755)

    def uid(self, uid: int) -> None:
        self.tool("id", f"echo {uid}")

    def node(self) -> None:
        self.tool("node", "exit 0")

    def apt_get(self, works: bool = True) -> None:
        """apt-get that logs its arguments; `install` creates the packages' binaries in the sandbox."""
        self.tool("apt-get", f"""echo "apt-get $*" >> {self.log}
{'' if works else 'echo "E: Unable to locate package" >&2; exit 100'}
for a in "$@"; do
  case "$a" in
    chromium) {shutil.which("mkdir")} -p {self.chromium.parent}; : > {self.chromium}; {shutil.which("chmod")} +x {self.chromium} ;;
    nodejs) printf '#!{BASH}\\nexit 0\\n' > {self.bin}/node; {shutil.which("chmod")} +x {self.bin}/node ;;
  esac
done""")

    def sudo(self, password_less: bool) -> None:
        self.tool("sudo", f"""[ "$1" = -n ] && shift
{'' if password_less else 'echo "sudo: a password is required" >&2; exit 1'}
[ "$1" = true ] && exit 0
echo "sudo $*" >> {self.log}
exec "$@" """)

    def have_chromium(self) -> None:
        self.chromium.parent.mkdir(parents=True, exist_ok=True)
        self.chromium.write_text("")
        self.chromium.chmod(0o755)

    def run(self, **env) -> subprocess.CompletedProcess:
        full = {"PATH": str(self.bin), "H3_CHROMIUM": str(self.chromium), **env}
        return subprocess.run([BASH, str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)

    def apt_calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def box(tmp_path):
    return Sandbox(tmp_path)


def test_silent_when_everything_is_there(box):
    box.uid(1000)
    box.node()
    box.have_chromium()
    box.apt_get()
    out = box.run()
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert box.apt_calls() == []


def test_skip_browser_needs_no_chromium(box):
    box.uid(1000)
    box.node()
    out = box.run(H3_SKIP_BROWSER="1")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_cannot_install_says_what_to_run(box):
    """Not root, sudo wants a password: exit 1 with the apt-get command and the way to skip, nothing attempted."""
    box.uid(1000)
    box.node()
    box.apt_get()
    box.sudo(password_less=False)
    out = box.run()
    assert out.returncode == 1, out.stderr
    assert f"needs Chromium at {box.chromium}" in out.stderr
    assert "sudo apt-get update && sudo apt-get install -y chromium" in out.stderr
    assert "H3_SKIP_BROWSER=1 make test" in out.stderr
    assert box.apt_calls() == []


def test_cannot_install_without_apt_get(box):
    box.uid(0)
    box.node()
    out = box.run()
    assert out.returncode == 1
    assert "no apt-get here" in out.stderr and "H3_CHROMIUM=" in out.stderr
    assert "H3_SKIP_BROWSER=1 make test" in out.stderr


def test_root_installs_then_is_silent(box):
    box.uid(0)
    box.apt_get()
    out = box.run()
    assert out.returncode == 0, out.stderr
    assert "installing chromium nodejs with apt-get" in out.stderr
    calls = box.apt_calls()
    assert calls[0] == "apt-get update -qq" and calls[1] == "apt-get install -y -qq chromium nodejs"
    again = box.run()  # idempotent: everything is there now
    assert (again.returncode, again.stderr) == (0, "")
    assert box.apt_calls() == calls


def test_password_less_sudo_installs(box):
    box.uid(1000)
    box.node()
    box.apt_get()
    box.sudo(password_less=True)
    out = box.run()
    assert out.returncode == 0, out.stderr
    assert box.apt_calls() == ["sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq", "apt-get update -qq",
                               "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium",
                               "apt-get install -y -qq chromium"]


def test_failed_install_says_what_to_run(box):
    box.uid(0)
    box.node()
    box.apt_get(works=False)
    out = box.run()
    assert out.returncode == 1
    assert "apt-get could not install chromium" in out.stderr
    assert "apt-get update && apt-get install -y chromium" in out.stderr and "sudo " not in out.stderr


def test_make_test_and_ci_use_the_script():
    make = (ROOT / "Makefile").read_text()
    test_rule = next(line for line in make.splitlines() if line.startswith("test:"))
    assert test_rule.split()[1] == "browser-deps", "make test checks the browser before building the venv"
    deps_recipe = make.split("\nbrowser-deps:\n", 1)[1].splitlines()[0]
    assert "scripts/ensure_browser.sh" in deps_recipe
    assert "scripts/ensure_browser.sh" in (ROOT / ".ci" / "run").read_text()
    assert os.access(SCRIPT, os.X_OK)
