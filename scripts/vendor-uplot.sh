#!/usr/bin/env bash
# Copy uPlot (the dashboard's charts) from its npm package into swarm_node/dashboard/vendor/, and record the
# version and sha256 of each file in vendor/VENDOR.txt (tests/test_dashboard.py checks the files against it).
# Run by a maintainer to update it (`scripts/vendor-uplot.sh 1.6.32`); the page never fetches anything.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-1.6.32}
DEST=swarm_node/dashboard/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$VERSION" >/dev/null && tar -xzf "uplot-$VERSION.tgz")
mkdir -p "$DEST"
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$DEST/"
cp "$tmp/package/LICENSE" "$DEST/uPlot.LICENSE"
{
  echo "uPlot $VERSION (MIT, https://github.com/leeoniya/uPlot), from the npm package uplot@$VERSION"
  (cd "$DEST" && sha256sum uPlot.iife.min.js uPlot.min.css uPlot.LICENSE)
} > "$DEST/VENDOR.txt"
cat "$DEST/VENDOR.txt"
