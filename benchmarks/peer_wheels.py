"""Peer wheels for the GPU machine, which has no network: benchmarks/peer_wheels.py downloads
(here, through pip) the wheels the optional peers need and lays them out as carry folders of at
most 60 MiB each, since a device call carries 64 MiB in all.

    python benchmarks/peer_wheels.py                # -> .wheels-1/, .wheels-2/, ... (git-ignored)
    python benchmarks/peer_wheels.py --peers cudnn  # cudnn-frontend only (one folder)

Then one device call per folder, each within the 30 s the machine stays warm after the one
before, every call running benchmarks/gpu.sh with carry=[".wheels-K"]: gpu.sh stashes what a
call carries in /tmp/wheels on the machine, joins a split wheel once all its parts are there,
and installs the whole wheels into /tmp/site. The last call runs the steps that need the peers
(e.g. `bash benchmarks/gpu.sh prefill`). A wheel over the folder size travels split into
`<wheel>.part-NN` pieces with a `<wheel>.parts` file that counts them.

Pins (../shared/BENCHMARKS.md in the project brief): FlashAttention-4 4.0.0b36 on CUTLASS DSL
4.8.1 (cp312, manylinux_2_28), cudnn-frontend 1.32 for cuDNN's FP8 peer.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys

PEER_WHEELS = {
    "fa4": ("flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl==4.8.1",
            "nvidia-cutlass-dsl-libs-base==4.8.1", "nvidia-cutlass-dsl-libs-core==4.8.1",
            "nvidia-cutlass-dsl-libs-cu13==4.8.1", "quack-kernels==0.6.5",
            "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5", "einops",
            "cuda-bindings==13.5.0", "cuda-pathfinder==1.9.0"),
    "cudnn": ("nvidia-cudnn-frontend==1.32.0",),
}
MIB = 1 << 20
# A call carries 64 MiB with the working tree (a few MiB): leave it room.
FOLDER_BYTES = 60 * MIB
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def download(requirements, into: pathlib.Path) -> None:
    """The wheels of `requirements` (no dependencies: the pins are complete) for the device's
    Python 3.12 on x86-64 Linux."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    "--abi", "cp312", *platforms, "-d", str(into), *requirements], check=True)


def pieces(wheels: list[pathlib.Path], limit: int) -> list[pathlib.Path]:
    """The files to carry: each wheel whole, or split into `<wheel>.part-NN` files of at most
    `limit` bytes beside a `<wheel>.parts` count."""
    files = []
    for wheel in wheels:
        data = wheel.read_bytes()
        if len(data) <= limit:
            files.append(wheel)
            continue
        count = -(-len(data) // limit)
        for index in range(count):
            part = wheel.with_name(f"{wheel.name}.part-{index:02d}")
            part.write_bytes(data[index * limit:(index + 1) * limit])
            files.append(part)
        count_file = wheel.with_name(f"{wheel.name}.parts")
        count_file.write_text(f"{count}\n")
        files.append(count_file)
    return files


def pack(files: list[pathlib.Path], limit: int) -> list[list[pathlib.Path]]:
    """Files into folders of at most `limit` bytes, largest first into the first that fits."""
    folders: list[list[pathlib.Path]] = []
    sizes: list[int] = []
    for path in sorted(files, key=lambda p: -p.stat().st_size):
        size = path.stat().st_size
        for index, used in enumerate(sizes):
            if used + size <= limit:
                folders[index].append(path)
                sizes[index] += size
                break
        else:
            folders.append([path])
            sizes.append(size)
    return folders


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/peer_wheels.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--peers", nargs="+", choices=sorted(PEER_WHEELS),
                        default=sorted(PEER_WHEELS))
    parser.add_argument("--root", default=".", help="where the .wheels-K folders go (the "
                                                    "repository root, whose .gitignore has them)")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root)
    downloads = root / ".wheels-download"
    shutil.rmtree(downloads, ignore_errors=True)
    downloads.mkdir(parents=True)
    download([r for peer in args.peers for r in PEER_WHEELS[peer]], downloads)
    # A part is at most half a folder, so that a split wheel's pieces pack with the others.
    files = pieces(sorted(downloads.glob("*.whl")), FOLDER_BYTES // 2)
    for old in root.glob(".wheels-[0-9]*"):
        shutil.rmtree(old)
    for index, folder in enumerate(pack(files, FOLDER_BYTES), start=1):
        target = root / f".wheels-{index}"
        target.mkdir()
        for path in folder:
            shutil.copy2(path, target / path.name)
        total = sum(p.stat().st_size for p in folder) / MIB
        print(f"{target}: {len(folder)} files, {total:.1f} MiB")
    shutil.rmtree(downloads)


if __name__ == "__main__":
    main()
