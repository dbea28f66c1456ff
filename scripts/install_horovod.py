"""Build, cache, install and verify Horovod 0.28.1, with hvdtrain's patches, against the installed torch.

Run with the Python of the environment that should receive Horovod:

    .venv/bin/python scripts/install_horovod.py        # or scripts/install-horovod

Standard library only, so it runs before hvdtrain itself is installed (Docker images use the same files). This is
the entry point that the Makefile, scripts/setup-env, the Dockerfiles and the docs call; the work is in
scripts/horovod/: install_plan.py (what to build and its cache key: pure), install_toolchain.py (torch, compilers,
CUDA toolkit, NCCL) and install_build.py (the patch series applied to the pristine sdist, compiled, verified,
cached). hvdtrain's changes to Horovod are the unified diffs of scripts/horovod/patches, in the order of its
`series` file, each with a header saying why, upstream's reference, what depends on it and what switches it on.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "horovod"))

from install_build import install  # noqa: E402
from install_plan import HOROVOD_VERSION, InstallError, cache_key, parse_check_build  # noqa: E402
from install_toolchain import probe_torch  # noqa: E402

# What the callers outside this folder use: scripts/choose_torch.py, docker/build.py, the Dockerfiles' check.
__all__ = ["HOROVOD_VERSION", "InstallError", "cache_key", "install", "main", "parse_check_build", "probe_torch"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain")), help="wheel (and sdist) cache root")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--no-apt", action="store_true",
                        help="never install system packages; stop and name the missing ones")
    parser.add_argument("--no-test-tools", action="store_true",
                        help="skip the tools only hvdtrain's tests need (sshd), e.g. in an image")
    args = parser.parse_args(argv)
    try:
        install(sys.executable, args.cache_dir, args.force, use_apt=not args.no_apt,
                test_tools=not args.no_test_tools)
    except InstallError as err:
        print(f"install-horovod: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
