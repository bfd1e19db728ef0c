#!/usr/bin/env python3
"""Unpacks a .deb's files into a directory, like `dpkg-deb -x DEB DIR`, on a machine that has
neither dpkg-deb nor ar (tests/gpu/device-run.sh, DEB_EXTRACT=python).

A .deb is an ar archive whose data.tar.{xz,gz,bz2} member holds the files."""
import io
import sys
import tarfile


def ar_members(path):
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            sys.exit(f"{path}: not an ar archive")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            data = f.read(size)
            if size % 2:
                f.read(1)  # members are 2-byte aligned
            yield name, data


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: deb_extract.py DEB DIR")
    deb, dest = sys.argv[1], sys.argv[2]
    for name, data in ar_members(deb):
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                if hasattr(tarfile, "tar_filter"):  # Python >= 3.12 (and backports): no paths outside DIR
                    tar.extractall(dest, filter="tar")
                else:
                    tar.extractall(dest)
            return
    sys.exit(f"{deb}: no data.tar member")


if __name__ == "__main__":
    main()
