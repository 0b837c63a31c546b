#!/usr/bin/env bash
# Checks scripts/install.sh and packaging/vqosd.service: stages an install (DESTDIR) of
# prebuilt binaries (--bin-dir) and checks what it placed (binaries, unit, config, shell
# completions, man pages rendered without warnings by groff or man when present), that a
# second run (--no-build) changes nothing and keeps the config; then verifies the unit with
# `systemd-analyze verify` (works without systemd as PID 1). Installs the `systemd` package
# when the tool is missing and apt-get is there (as root); otherwise skips that part.
#
# The binaries: VQOS_BIN_DIR=DIR (vqosd and vqos already built, e.g. a CI artifact), else the
# workspace's release build (in CARGO_TARGET_DIR, default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "FAIL: $*"; exit 1; }

if [ -n "${VQOS_BIN_DIR:-}" ]; then
  bins="$VQOS_BIN_DIR"
else
  # cargo install would rebuild them all in a target directory of its own.
  cargo build --release --quiet -p vqosd -p vqos-cli
  bins="${CARGO_TARGET_DIR:-target}/release"
fi
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage" scripts/install.sh --prefix /usr --bin-dir "$bins" >/dev/null

placed=(usr/bin/vqosd usr/bin/vqos etc/vqos/vqosd.toml etc/systemd/system/vqosd.service
  usr/share/bash-completion/completions/vqos usr/share/zsh/site-functions/_vqos
  usr/share/fish/vendor_completions.d/vqos.fish
  usr/share/man/man1/vqos.1 usr/share/man/man1/vqos-policy.1 usr/share/man/man1/vqos-status.1
  usr/share/man/man5/vqosd.toml.5 usr/share/man/man8/vqosd.8)
for f in "${placed[@]}"; do
  [ -s "$stage/$f" ] || fail "install.sh did not place $f"
done
for b in vqosd vqos; do
  cmp -s "$bins/$b" "$stage/usr/bin/$b" || fail "usr/bin/$b is not the --bin-dir binary"
  [ "$(stat -c %a "$stage/usr/bin/$b")" = 755 ] || fail "usr/bin/$b is not mode 755"
done
mode="$(stat -c %a "$stage/etc/vqos/vqosd.toml")"
[ "$mode" = 600 ] || fail "the config is installed $mode, not 600"
for f in "$stage"/usr/share/man/man*/* "$stage"/usr/share/*/*/*vqos*; do
  [ "$(stat -c %a "$f")" = 644 ] || fail "${f#"$stage"/} is not mode 644"
done
# Nothing of the build host's paths in the unit: ExecStart is the prefix's.
grep -q "^ExecStart=/usr/bin/vqosd " "$stage/etc/systemd/system/vqosd.service" \
  || fail "the unit's ExecStart is not /usr/bin/vqosd"

# Completions: each is its shell's script for vqos (and parses, where the shell is here).
comp="$stage/usr/share"
grep -q "complete .*vqos" "$comp/bash-completion/completions/vqos" || fail "bash completion"
bash -n "$comp/bash-completion/completions/vqos" || fail "bash -n on the bash completion"
head -1 "$comp/zsh/site-functions/_vqos" | grep -q "^#compdef vqos" || fail "zsh completion"
grep -q "^complete -c vqos" "$comp/fish/vendor_completions.d/vqos.fish" || fail "fish completion"
if command -v zsh >/dev/null; then zsh -n "$comp/zsh/site-functions/_vqos" || fail "zsh -n"; fi
if command -v fish >/dev/null; then
  fish -n "$comp/fish/vendor_completions.d/vqos.fish" || fail "fish -n"
fi

# Man pages: the right section in each directory, rendered without a warning.
man_dir="$stage/usr/share/man"
grep -q '^\.TH vqosd 8 ' "$man_dir/man8/vqosd.8" || fail "vqosd.8 is not a section 8 page"
grep -q '^\.TH VQOSD.TOML 5 ' "$man_dir/man5/vqosd.toml.5" || fail "vqosd.toml.5 is not section 5"
grep -q '^\.TH vqos 1 ' "$man_dir/man1/vqos.1" || fail "vqos.1 is not a section 1 page"
pages=("$man_dir"/man1/*.1 "$man_dir"/man5/*.5 "$man_dir"/man8/*.8)
if command -v groff >/dev/null; then
  for p in "${pages[@]}"; do
    warn="$(groff -man -Tutf8 -ww -z "$p" 2>&1)" || fail "groff cannot render ${p#"$stage"/}"
    [ -z "$warn" ] || { echo "$warn"; fail "groff warns on ${p#"$stage"/}"; }
  done
  echo "ok  ${#pages[@]} man pages render without warnings (groff -man -ww)"
elif command -v man >/dev/null; then
  for p in "${pages[@]}"; do
    warn="$(MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null)" || fail "man -l ${p#"$stage"/}"
    [ -z "$warn" ] || { echo "$warn"; fail "man warns on ${p#"$stage"/}"; }
  done
  echo "ok  ${#pages[@]} man pages render without warnings (man -l)"
else
  echo "SKIP: neither groff nor man here: the man pages' rendering is not checked"
fi

# A second run (binaries in place: --no-build) changes nothing but a stale page, and keeps
# the config.
echo "# local edit" >>"$stage/etc/vqos/vqosd.toml"
sums() { (cd "$stage" && find . -type f ! -path ./etc/vqos/vqosd.toml -exec sha256sum {} + | sort); }
before="$(sums)"
touch "$man_dir/man1/vqos-gone.1"
DESTDIR="$stage" scripts/install.sh --prefix /usr --no-build >/dev/null
grep -q "# local edit" "$stage/etc/vqos/vqosd.toml" || fail "install.sh overwrote the config"
[ ! -e "$man_dir/man1/vqos-gone.1" ] || fail "install.sh kept the page of a gone subcommand"
[ "$before" = "$(sums)" ] || { diff <(echo "$before") <(sums) || true; fail "a second run changed files"; }
# Refusals: a --bin-dir without the binaries, and two ways of getting them at once.
if DESTDIR="$stage" scripts/install.sh --prefix /usr --bin-dir "$stage/nowhere" 2>/dev/null; then
  fail "install.sh accepted a --bin-dir without the binaries"
fi
if DESTDIR="$stage" scripts/install.sh --prefix /usr --bin-dir "$bins" --no-build 2>/dev/null; then
  fail "install.sh accepted --bin-dir with --no-build"
fi
echo "ok  scripts/install.sh (--bin-dir, --no-build, DESTDIR): binaries, unit, config, completions, man pages"

if ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq systemd >/dev/null || true
  fi
fi
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not found (install the systemd package to verify the unit)"
  exit 0
fi
# verify resolves ExecStart on the host: point it at the staged binary.
sed "s|/usr/bin/vqosd|$stage/usr/bin/vqosd|g; s|/etc/vqos/|$stage/etc/vqos/|g" \
  "$stage/etc/systemd/system/vqosd.service" >"$stage/vqosd.service"
out="$(systemd-analyze verify "$stage/vqosd.service" 2>&1)" || { echo "$out"; fail "systemd-analyze verify"; }
# verify prints warnings about the host (other units) without failing; ours must have none.
if echo "$out" | grep -q "vqosd.service"; then echo "$out"; fail "warnings on vqosd.service"; fi
"$stage/usr/bin/vqosd" --config "$stage/etc/vqos/vqosd.toml" --check
echo "ok  packaging/vqosd.service (systemd-analyze verify, staged install)"
