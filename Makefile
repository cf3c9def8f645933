# `make demo` and `make test` create .venv on first use and install everything they need; `make test` also installs
# Chromium and Node.js for the web tests where it can (scripts/ensure_browser.sh) and otherwise says what to run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.comfy-h3-installed
TORCH_VERSION ?= 2.13.0

.PHONY: demo test test-comfyui test-two-hosts comfyui-env venv clean-venv bench browser-deps

# The real-ComfyUI suite: ComfyUI's source (default: ../shared/comfyui, read only) and an environment like a user's,
# built by scripts/comfyui_env.py into $(COMFYUI_ENV) (ComfyUI's requirements + the pack's install.py; reused until
# they change). COMFYUI_PYTHON=<your ComfyUI's python> skips the build. K=EXPR passes -k EXPR to pytest.
COMFYUI_DIR ?= $(abspath ../shared/comfyui)
COMFYUI_ENV ?= .comfyui-venv
H3_SCREENSHOTS ?= $(CURDIR)/output/comfyui-screenshots
K ?=
# the real-ComfyUI suite's files: every tests/test_comfyui_*.py (each starts its own ComfyUI where it needs one)
COMFYUI_TESTS ?= $(sort $(wildcard tests/test_comfyui_*.py))

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "[make] torch found in $(PYTHON): keeping it (venv with system site-packages)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[test]"
	@# test-only: FastVideo's own VSA-H3 code, the reference of tests/test_vsa.py. Without its dependencies (it pins
	@# torch 2.12 and pulls CUDA torchvision) and off sys.path: tests/fastvideo_ref.py loads its two VSA modules.
	@test -d $(VENV)/fastvideo-ref/fastvideo || $(PY) -m pip install -q --no-deps --target $(VENV)/fastvideo-ref "fastvideo==0.2.1"
	@touch $(STAMP)

# Chromium and Node.js for the web tests, checked before the (slow) venv build
browser-deps:
	@bash scripts/ensure_browser.sh

demo: $(STAMP)
	$(PY) -m comfy_h3_nodes demo

# TESTS=<files> runs only those test files (CI runs two of them beside the rest); the two-host suite has its own target
TESTS ?= tests
TWO_HOSTS_TESTS ?= $(sort $(wildcard tests/test_two_hosts*.py))
test: browser-deps $(STAMP)
	$(PY) -m pytest -q $(TESTS) $(foreach f,$(TWO_HOSTS_TESTS),--ignore=$(f)) $(PYTEST_ARGS)
	node --test tests/web/

bench: $(STAMP)
	$(PY) -m comfy_h3_nodes bench handoff

# A and B as separate hosts (scripts/two_hosts.py: namespaces, a Spark's two links, cgroups; needs root): the tests
# whose names contain two_hosts, in tests/test_two_hosts*.py; the real ComfyUI's when COMFYUI_DIR is there
test-two-hosts: $(STAMP)
	@if [ -f "$(COMFYUI_DIR)/main.py" ]; then \
	  py="$${COMFYUI_PYTHON:-$$($(PYTHON) scripts/comfyui_env.py --comfyui "$(COMFYUI_DIR)" --env "$(COMFYUI_ENV)" | tail -n 1)}"; \
	  export COMFYUI_DIR="$(COMFYUI_DIR)" COMFYUI_PYTHON="$$py"; \
	else echo "[make] no ComfyUI at COMFYUI_DIR=$(COMFYUI_DIR): the two-host tests through the real ComfyUI are skipped"; \
	  unset COMFYUI_DIR; fi; \
	  $(PY) -m pytest -q $(TWO_HOSTS_TESTS) -k "two_hosts$(if $(K), and ($(K)))" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)

comfyui-env:
	@test -f "$(COMFYUI_DIR)/main.py" || { echo "[make] no ComfyUI at COMFYUI_DIR=$(COMFYUI_DIR): set COMFYUI_DIR to a checkout of ComfyUI's source (0.33 or newer)"; exit 2; }
	@$(PYTHON) scripts/comfyui_env.py --comfyui "$(COMFYUI_DIR)" --env "$(COMFYUI_ENV)" >/dev/null

test-comfyui: browser-deps $(STAMP)
	@test -f "$(COMFYUI_DIR)/main.py" || { echo "[make] no ComfyUI at COMFYUI_DIR=$(COMFYUI_DIR): set COMFYUI_DIR to a checkout of ComfyUI's source (0.33 or newer)"; exit 2; }
	@py="$${COMFYUI_PYTHON:-$$($(PYTHON) scripts/comfyui_env.py --comfyui "$(COMFYUI_DIR)" --env "$(COMFYUI_ENV)" | tail -n 1)}" && \
	  test -x "$$py" && echo "[make] real-ComfyUI suite: ComfyUI $(COMFYUI_DIR), its Python $$py, screenshots in $(H3_SCREENSHOTS)" && \
	  COMFYUI_DIR="$(COMFYUI_DIR)" COMFYUI_PYTHON="$$py" H3_SCREENSHOTS="$(H3_SCREENSHOTS)" \
	  $(PY) -m pytest -q $(COMFYUI_TESTS) $(if $(K),-k "$(K)") $(PYTEST_ARGS)
