#!/usr/bin/env bash
# The HTML report tests open reports in a real headless browser: install Debian's chromium when it is missing.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "ensure_chromium: chromium is missing; install Debian's chromium package (apt-get install chromium)" >&2
  exit 1
fi
echo "ensure_chromium: installing chromium (Debian package, about a minute)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
