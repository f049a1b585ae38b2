# The two commands of README.md, and a few conveniences.
.PHONY: run test down crds lint

run:   ## local cluster + CRDs + operator + an example task
	e2e/run-operator.sh

test:  ## every test: unit, property, e2e on a real cluster it brings up and takes down
	e2e/run-tests.sh

down:  ## stop the operator and the local cluster
	e2e/run-operator.sh stop
	e2e/cluster.sh down

crds:  ## regenerate crds/ from the Rust types
	cargo run -q --bin crdgen crds

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
