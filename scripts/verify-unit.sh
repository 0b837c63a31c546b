#!/usr/bin/env bash
# Checks packaging/vqosd.service with `systemd-analyze verify` (works without systemd as PID 1)
# after staging an install (scripts/install.sh, DESTDIR) so that its ExecStart exists.
# Installs the `systemd` package when the tool is missing and apt-get is there (as root);
# otherwise skips with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq systemd >/dev/null || true
  fi
fi
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not found (install the systemd package to verify the unit)"
  exit 0
fi
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
# The binaries from the workspace's release build (cargo install would rebuild them all in a
# target directory of its own); install.sh places the rest.
cargo build --release --quiet -p vqosd -p vqos-cli
install -d "$stage/usr/bin"
cp target/release/vqosd target/release/vqos "$stage/usr/bin/"
DESTDIR="$stage" scripts/install.sh --prefix /usr --no-build >/dev/null
for f in usr/bin/vqosd usr/bin/vqos etc/vqos/vqosd.toml etc/systemd/system/vqosd.service; do
  [ -e "$stage/$f" ] || { echo "FAIL: install.sh did not place $f"; exit 1; }
done
mode="$(stat -c %a "$stage/etc/vqos/vqosd.toml")"
[ "$mode" = 600 ] || { echo "FAIL: the config is installed $mode, not 600"; exit 1; }
# A second run changes nothing and keeps the config.
echo "# local edit" >>"$stage/etc/vqos/vqosd.toml"
DESTDIR="$stage" scripts/install.sh --prefix /usr --no-build >/dev/null
grep -q "# local edit" "$stage/etc/vqos/vqosd.toml" || { echo "FAIL: install.sh overwrote the config"; exit 1; }
# verify resolves ExecStart on the host: point it at the staged binary.
sed "s|/usr/bin/vqosd|$stage/usr/bin/vqosd|g; s|/etc/vqos/|$stage/etc/vqos/|g" \
  "$stage/etc/systemd/system/vqosd.service" >"$stage/vqosd.service"
out="$(systemd-analyze verify "$stage/vqosd.service" 2>&1)" || { echo "$out"; echo "FAIL: systemd-analyze verify"; exit 1; }
# verify prints warnings about the host (other units) without failing; ours must have none.
if echo "$out" | grep -q "vqosd.service"; then echo "$out"; echo "FAIL: warnings on vqosd.service"; exit 1; fi
"$stage/usr/bin/vqosd" --config "$stage/etc/vqos/vqosd.toml" --check
echo "ok  packaging/vqosd.service (systemd-analyze verify, staged install)"
