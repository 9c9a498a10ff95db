# ferrymq developer commands. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HYPOTHESIS_PROFILE ?= ci

.PHONY: setup test lint unit bench bench-store bench-metrics bench-metrics-callgrind demo clean soak-raft chaos chaos-tls chaos-secure soak fuzz

setup: $(STAMP)

$(STAMP): pyproject.toml src/ferrymq/wire/accel.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench,connect]'
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q -p no:cacheprovider

unit: setup
	$(BIN)/pytest -q tests/unit

# The Raft simulation over many more seeds than `make test` runs (2000); not part of `make test`.
# SEEDS=N and FIRST_SEED=K choose the range; a failure names its seed for replay.
SEEDS ?= 50000
FIRST_SEED ?= 2000
soak-raft: setup
	RAFT_SIM_SEEDS=$(SEEDS) RAFT_SIM_FIRST_SEED=$(FIRST_SEED) $(BIN)/pytest -q -p no:cacheprovider \
		tests/unit/raft/test_sim.py -k test_raft_stays_safe_and_live_under_faults

bench: bench-store

bench-store: setup
	$(BIN)/ferry bench store

# What the metrics cost the send path: broker CPU per send with and without them, side by side
# (docs/benchmarks.md "Metrics cost"); about 2.5 minutes.
bench-metrics: setup
	$(BIN)/python bench/metrics_cost.py --seconds 60 --rounds 30

# The same cost counted in instructions (valgrind's callgrind, about 5 minutes): it does not
# depend on what else the machine runs, which the timed run above does.
bench-metrics-callgrind: setup
	$(BIN)/python bench/metrics_cost.py --callgrind 4000 --rounds 4

# The demo's Connect pipeline needs PostgreSQL (Debian's package; the demo starts its own server)
# and its Spark parts a JVM: installed when missing, as .ci/run does (root, or sudo without a
# password). Without them the demo says so and fails.
demo: setup
	@need=""; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need="$$need postgresql"; \
	command -v java >/dev/null || need="$$need openjdk-17-jre-headless"; \
	if [ -n "$$need" ]; then \
		sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo -n"; \
		echo "installing$$need (apt-get)"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$need \
			|| echo "could not install$$need: the demo will say what is missing"; \
	fi
	$(BIN)/ferry demo

# About 7 minutes: 3 controllers and a 3-replica group in controller mode under every nemesis
# (failovers, controller leader and follower kills, a master cut off from the cluster, disk
# faults, clock jumps), plus 3 Connect workers taking config writes (their leader killed, paused,
# cut off; a follower paused), fixed seed, checked history; fails on any anomaly (Connect's too:
# an acknowledged config write lost, workers ending apart, two claims of one epoch, ...).
# CHAOS_ARGS=--connect-workers=0 leaves Connect out. CHAOS_TOPOLOGY=classic runs static
# master/slave roles instead; CHAOS_TOPOLOGY=controller-2groups runs two broker groups under the same
# controllers, faults aimed at both. Needs root, unshare, nftables, mkfs.ext4. Not part of `make test`.
CHAOS_SEED     ?= 1
CHAOS_OUT      ?= chaos-out
CHAOS_TOPOLOGY ?= controller
CHAOS_ARGS     ?=
chaos: setup
	$(BIN)/ferry chaos --schedule standard --topology $(CHAOS_TOPOLOGY) --seed $(CHAOS_SEED) --out $(CHAOS_OUT) $(CHAOS_ARGS)

# The same run with TLS only on every port and link (issue 23), the Connect workers' REST API
# too. Not part of `make test`.
chaos-tls: setup
	$(BIN)/ferry chaos --schedule standard --topology $(CHAOS_TOPOLOGY) --seed $(CHAOS_SEED) --out $(CHAOS_OUT)-tls --tls $(CHAOS_ARGS)

# The same run with TLS and ACL on (issue 23): every process signs with the run's admin account,
# slaves authenticate on the HA port. Not part of `make test`.
chaos-secure: setup
	$(BIN)/ferry chaos --schedule standard --topology $(CHAOS_TOPOLOGY) --seed $(CHAOS_SEED) --out $(CHAOS_OUT)-secure --tls --acl $(CHAOS_ARGS)

# A long chaos run: seeded rounds of every fault for DURATION (seconds, or 20m, 1h), one history,
# one check.
# docs/reliability.md records what a soak measured. Not part of `make test`.
DURATION  ?= 900
SOAK_SEED ?= 1
SOAK_OUT  ?= soak-out
soak: setup
	$(BIN)/ferry chaos --schedule soak --duration $(DURATION) --topology $(CHAOS_TOPOLOGY) --seed $(SOAK_SEED) --out $(SOAK_OUT) --drain-timeout 180 --converge-timeout 120

# Coverage-guided fuzzing of every wire and on-disk decoder, FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 60
fuzz: setup
	for target in $$($(BIN)/python -c 'from tests.fuzz.targets import TARGETS; print(*TARGETS)'); do \
		$(BIN)/python -m tests.fuzz.run $$target -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
