# Sourced by compare.sh and serve.sh: `release_build [--quiet]` builds the
# release binaries of the workspace (target/release/seckill and
# target/release/loadtest), the same command for both scripts so that one
# never rebuilds what the other built. When nothing changed, cargo answers in
# about a second; a first build says how long it takes and shows cargo's
# progress (--quiet is ignored then: a silent build of minutes looks hung).

# A first release build on a 2-core machine (README: 6 min 52 s measured on
# an idle one, crates already downloaded); the line printed before it quotes
# this figure.
FIRST_RELEASE_BUILD="about 7 minutes on a 2-core machine, more while crates download"

release_build() {
  if [ ! -x target/release/seckill ] || [ ! -x target/release/loadtest ]; then
    echo "building seckill and loadtest in release mode for the first time ($FIRST_RELEASE_BUILD); cargo's progress follows" >&2
    cargo build --release --workspace
  else
    cargo build --release --workspace "$@"
  fi
}
