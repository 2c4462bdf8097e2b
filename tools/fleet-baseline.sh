#!/usr/bin/env bash
# Builds the fleet benchmark (tests/benches/fleet.rs) against the controller of a base commit, so
# `make bench` can measure it beside the current controller in the same run, and prints the path
# of the built bench binary on stdout (build output goes to stderr).
#
#   tools/fleet-baseline.sh            # base commit 18d8eb5 (before the reconcile refactor)
#   FLEET_BASELINE_COMMIT=<rev> tools/fleet-baseline.sh
#
# The base commit's tree is unpacked with `git archive` into .bench/baseline-<rev>/ (git-ignored;
# no worktree is registered), then the bench and the files it needs from this tree are copied
# in: the bench itself, the in-memory Kubernetes API (tests/src/fake_kube.rs) and the fleet
# stand-ins (tests/src/fleet.rs), with their module and Cargo entries. The bench uses only APIs
# both trees have (Context::with_member_ops, reconcile::run, KubernetesRuntime::new, MemberOps).
# Built in release (cargo bench's profile) into FLEET_BASELINE_TARGET (default .bench/target;
# pointing it at this tree's target directory shares the compiled dependencies, which the two
# trees' near-identical Cargo.lock allows, at the price of rebuilding the workspace's own crates
# on each switch), and copied to .bench/fleet-baseline-<rev>, whose path is printed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COMMIT=${FLEET_BASELINE_COMMIT:-18d8eb5}
CARGO=${CARGO:-cargo}
REV=$(git -C "$ROOT" rev-parse --short=12 "$COMMIT^{commit}")
DIR=$ROOT/.bench/baseline-$REV
TARGET=${FLEET_BASELINE_TARGET:-$ROOT/.bench/target}

if [[ ! -f $DIR/.unpacked ]]; then
    rm -rf "$DIR"
    mkdir -p "$DIR"
    git -C "$ROOT" archive "$REV" | tar -x -C "$DIR"
    touch "$DIR/.unpacked"
fi

# The bench and its support files, as in this tree (copied again each time: they may change).
cp "$ROOT/tests/benches/fleet.rs" "$DIR/tests/benches/fleet.rs"
cp "$ROOT/tests/src/fake_kube.rs" "$ROOT/tests/src/fleet.rs" "$DIR/tests/src/"
grep -q '^pub mod fleet;' "$DIR/tests/src/lib.rs" \
    || sed -i 's/^pub mod fake_kube;$/pub mod fake_kube;\npub mod fleet;/' "$DIR/tests/src/lib.rs"
# The tests crate's manifest: this tree's (the bench entry, futures as a dependency,
# tracing-subscriber), checked to name only workspace dependencies the base tree has.
for dep in $(sed -n 's/^\([a-z0-9_-]*\) = { workspace = true.*/\1/p' "$ROOT/tests/Cargo.toml"); do
    grep -q "^$dep = " "$DIR/Cargo.toml" || {
        echo "fleet-baseline: the base tree's workspace has no dependency $dep" >&2
        exit 1
    }
done
cp "$ROOT/tests/Cargo.toml" "$DIR/tests/Cargo.toml"

# protoc for etcd-client's build: this tree's (the base tree's .cargo/config.toml points at its
# own .tools/, which it does not have).
export PROTOC=${PROTOC:-$ROOT/.tools/protoc/bin/protoc}
[[ -x $PROTOC ]] || {
    echo "fleet-baseline: no protoc at $PROTOC (make tools-protoc)" >&2
    exit 1
}

BIN=$(cd "$DIR" && CARGO_TARGET_DIR=$TARGET "$CARGO" bench -p etcd-operator-tests --bench fleet \
    --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[[ -n $BIN && -x $BIN ]] || {
    echo "fleet-baseline: the build named no bench binary" >&2
    exit 1
}
# Copied out: cargo names the workspace's artifacts the same in both trees, so a shared target
# directory's next build of this tree overwrites the one at $BIN.
cp "$BIN" "$ROOT/.bench/fleet-baseline-$REV"
echo "$ROOT/.bench/fleet-baseline-$REV"
