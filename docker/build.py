#!/usr/bin/env python3
"""Build hvdtrain's container images with docker or podman (standard library only).

    python3 docker/build.py cpu                      # hvdtrain:cpu
    python3 docker/build.py gpu --build-arg CUDA_CC_LIST=90
    python3 docker/build.py base                     # the Debian base image, made offline (debootstrap)

`make docker-cpu` / `make docker-gpu` call this. Before building it fills the build context's
`docker/cache/` (git-ignored) with what the host already has, so the image does not fetch or
compile it again:

- `docker/cache/torch/`: the CPU torch wheel, fetched by the host's own pip (which honours its
  find-links and indexes; on our machines it lies on disk). CPU image only; without it the image
  installs torch from TORCH_INDEX_URL.
- `docker/cache/hvdtrain/wheels/<key>/`: the Horovod wheel that scripts/install-horovod built and
  cached on the host, when its cache key (Horovod, torch, Python, CPU/CUDA) matches the image's.
  The image's install script uses it and verifies it; otherwise it compiles Horovod itself.

Extra CA certificates (for TLS-intercepting proxies) reach the build as a build secret, never
through the context or a layer: `--ca-certs DIR_OR_FILE`, by default the host's local CA folder
when it holds any certificate.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / "cache"
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
CA_SECRET_ID = "extra-ca"
SOURCES = [Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")]
# The tag Dockerfile.cpu's BASE_IMAGE defaults to, and the Debian release it is.
DEFAULT_BASE = "debian:bookworm-slim"
SUITE = "bookworm"


class BuildError(Exception):
    """A failure the user can act on; main() prints it as one line."""


def say(message: str) -> None:
    print(f"[docker-build] {message}", flush=True)


# ---------------------------------------------------------------- pure parts (unit tested)

def debian_mirrors(texts: list[str], suite: str = SUITE) -> tuple[str, str | None]:
    """(main mirror, security mirror or None) for `suite` from apt sources, one-line or deb822.

    The first `deb` entry (not deb-src) carrying `suite` with component `main` is the mirror;
    one carrying `suite`-security is the security mirror.
    """
    entries: list[tuple[str, list[str], list[str]]] = []   # (uri, suites, components)
    for text in texts:
        for line in text.splitlines():
            words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 4 and words[0] == "deb":
                entries.append((words[1], [words[2]], words[3:]))
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                match = re.match(r"([A-Za-z-]+):\s*(.*)", line)
                if match and not line.startswith("#"):
                    fields[match.group(1).lower()] = match.group(2)
            if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                entries.append((uri, fields.get("suites", "").split(), fields.get("components", "").split()))
    main = next((uri for uri, suites, comps in entries if suite in suites and "main" in comps), None)
    security = next((uri for uri, suites, comps in entries if f"{suite}-security" in suites), None)
    if main is None:
        raise BuildError(f"no apt source for Debian {suite} (main) in /etc/apt; pass --mirror URL")
    return main.rstrip("/"), security.rstrip("/") if security else None


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG defaults of a Dockerfile: {'TORCH_VERSION': '2.13.0', ...} (first definition wins)."""
    args: dict[str, str] = {}
    for match in re.finditer(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S*)", text, re.M):
        args.setdefault(match.group(1), match.group(2).strip("\"'"))
    return args


def expand(value: str, values: dict[str, str]) -> str:
    """`${NAME}` references in an ARG value, filled from the other ARGs (build args over defaults).

    Example:
        >>> expand("nvidia/cuda:${CUDA_VERSION}-devel", {"CUDA_VERSION": "13.0.2"})
        'nvidia/cuda:13.0.2-devel'
    """
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: values.get(m.group(1), m.group(0)), value)


def horovod_cache_key(torch_wheel: str, python: str) -> str:
    """The key scripts/install-horovod gives a CPU build for this torch wheel and Python."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import install_horovod as ih
    finally:
        sys.path.pop(0)
    torch_version = torch_wheel.split("-")[1]          # torch-2.13.0+cpu-cp311-... -> 2.13.0+cpu
    return ih.cache_key(ih.HOROVOD_VERSION, torch_version, python, None, False)


def ca_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    return sorted(p for p in source.glob("**/*") if p.is_file() and p.suffix in (".crt", ".pem"))


# ---------------------------------------------------------------- side effects

def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    say("$ " + " ".join(cmd))
    return subprocess.run(cmd, **kwargs)


def pick_engine(name: str) -> list[str]:
    """The engine command: docker when its daemon answers, else podman (with runc when installed)."""
    if name == "auto":
        docker = shutil.which("docker")
        if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
            name = "docker"
        elif shutil.which("podman"):
            name = "podman"
        else:
            raise BuildError("neither a working docker (daemon) nor podman found; install one "
                             "(Debian: apt-get install podman runc)")
    if name == "podman":
        # crun, podman's default runtime, fails on cgroup v1 machines like ours; runc works on both.
        return ["podman", "--runtime", "runc"] if shutil.which("runc") else ["podman"]
    return [name]


def image_exists(engine: list[str], name: str) -> bool:
    return subprocess.run([*engine, "image", "inspect", name], capture_output=True).returncode == 0


def make_base_image(engine: list[str], name: str = DEFAULT_BASE, mirror: str | None = None) -> None:
    """Create `name` from the host's Debian mirror with debootstrap (no registry needed)."""
    if image_exists(engine, name):
        say(f"base image {name} exists; kept")
        return
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing (Debian: apt-get install debootstrap)")
    texts = []
    for source in SOURCES:
        files = sorted(source.glob("*")) if source.is_dir() else [source]
        texts += [f.read_text() for f in files if f.is_file() and f.suffix in ("", ".list", ".sources")]
    main_uri, security_uri = debian_mirrors(texts)
    main_uri = mirror or main_uri
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hvdtrain-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"debootstrap {SUITE} from {main_uri} (about 2 minutes)")
        if run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), main_uri],
               stdout=subprocess.DEVNULL).returncode != 0:
            raise BuildError(f"debootstrap from {main_uri} failed (see its output above)")
        suites = f"{SUITE} {SUITE}-updates"
        stanzas = [f"Types: deb\nURIs: {main_uri}\nSuites: {suites}\nComponents: main\n"
                   "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"]
        if security_uri:
            stanzas.append(f"Types: deb\nURIs: {security_uri}\nSuites: {SUITE}-security\nComponents: main\n"
                           "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text("\n".join(stanzas))
        # Like the official -slim image: later packages come without manuals and translations.
        (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(
            "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
            "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n"
            "path-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n")
        for folder in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            for child in (rootfs / folder).glob("*"):
                if child.is_file() or child.is_symlink():
                    child.unlink()
                elif child.is_dir() and child.name != "partial":
                    shutil.rmtree(child)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        imported = run([*engine, "import", "--change", 'CMD ["bash"]', "-", name], stdin=tar.stdout,
                       stdout=subprocess.DEVNULL)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise BuildError(f"could not import the debootstrapped tree as {name}")
    say(f"base image {name} made offline in {time.monotonic() - start:.0f} s")


def fetch_torch_wheel(version: str, python_tag: str, dest: Path) -> Path | None:
    """The CPU torch wheel for the image's Python, with the host's pip; None when pip cannot get one."""
    dest.mkdir(parents=True, exist_ok=True)
    pattern = f"torch-{version}+cpu-{python_tag}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    for extra in ([], ["--index-url", "https://download.pytorch.org/whl/cpu"]):
        proc = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_tag[2:], "--platform", "manylinux_2_28_x86_64",
                    "--timeout", "30", "--retries", "1", "-d", str(dest), f"torch=={version}+cpu", *extra],
                   capture_output=True, text=True)
        found = sorted(dest.glob(pattern))
        if proc.returncode == 0 and found:
            return found[0]
    say(f"the host's pip cannot supply torch {version}+cpu; the image will install it from TORCH_INDEX_URL")
    return None


def seed_horovod_wheel(host_cache: Path, key: str) -> bool:
    """Copy the host's cached Horovod wheel for `key` into the context's cache; True if there was one."""
    dest = CACHE / "hvdtrain" / "wheels"
    shutil.rmtree(dest, ignore_errors=True)
    wheels = sorted((host_cache / "wheels" / key).glob("horovod-*.whl"))
    if not wheels:
        say(f"no cached Horovod wheel {key} on this host; the image compiles Horovod (8-10 min on 2 cores)")
        return False
    (dest / key).mkdir(parents=True)
    shutil.copy2(wheels[0], dest / key / wheels[0].name)
    say(f"reusing the host's Horovod wheel {key}/{wheels[0].name}")
    return True


def ca_secret(source: str, workdir: Path) -> Path | None:
    """One PEM file with every extra CA certificate, for `--secret id=extra-ca`; None for none."""
    if source == "none":
        return None
    path = LOCAL_CA_DIR if source == "auto" else Path(source)
    files = ca_files(path) if path.exists() else []
    if not files:
        if source != "auto":
            raise BuildError(f"--ca-certs {source}: no .crt or .pem file there")
        return None
    bundle = workdir / "extra-ca.pem"
    bundle.write_text("".join(f.read_text().rstrip() + "\n" for f in files))
    say(f"extra CA certificates for the build (a build secret, not kept in the image): "
        f"{', '.join(f.name for f in files)}")
    return bundle


def build(args: argparse.Namespace) -> None:
    engine = pick_engine(args.engine)
    dockerfile = HERE / f"Dockerfile.{args.variant}"
    defaults = dockerfile_args(dockerfile.read_text())
    build_args = dict(item.split("=", 1) for item in args.build_arg)
    # The GPU base is nvidia/cuda:${CUDA_VERSION}-...: made offline under its real, expanded name.
    base = expand(build_args.get("BASE_IMAGE", defaults.get("BASE_IMAGE", DEFAULT_BASE)), {**defaults, **build_args})
    if args.offline_base:
        make_base_image(engine, base)
    if args.variant == "cpu" and not args.no_host_wheels:
        python = build_args.get("PYTHON_VERSION", defaults["PYTHON_VERSION"])
        torch_version = build_args.get("TORCH_VERSION", defaults["TORCH_VERSION"])
        shutil.rmtree(CACHE / "torch", ignore_errors=True)
        wheel = fetch_torch_wheel(torch_version, "cp" + python.replace(".", ""), CACHE / "torch")
        shutil.rmtree(CACHE / "hvdtrain", ignore_errors=True)
        if wheel and not args.compile_horovod:
            seed_horovod_wheel(args.host_cache, horovod_cache_key(wheel.name, python))
    else:
        for sub in ("torch", "hvdtrain"):
            shutil.rmtree(CACHE / sub, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-build-") as tmp:
        cmd = [*engine, "build", "-f", str(dockerfile), "-t", args.tag or f"hvdtrain:{args.variant}"]
        if engine[0] == "podman":
            # --network=host: the build reaches the registries exactly as the host does.
            # --format docker: the OCI format has no SHELL, and the Dockerfiles' pipefail needs it.
            cmd += ["--network=host", "--format", "docker"]
        secret = ca_secret(args.ca_certs, Path(tmp))
        if secret:
            cmd += ["--secret", f"id={CA_SECRET_ID},src={secret}"]
        for item in args.build_arg:
            cmd += ["--build-arg", item]
        env = dict(os.environ, DOCKER_BUILDKIT="1")   # RUN --mount needs BuildKit on docker
        start = time.monotonic()
        if run([*cmd, str(ROOT)], env=env).returncode != 0:
            raise BuildError(f"{' '.join(engine)} build of {dockerfile.name} failed (see above)")
        seconds = time.monotonic() - start
    tag = args.tag or f"hvdtrain:{args.variant}"
    size = subprocess.run([*engine, "image", "inspect", "--format", "{{.Size}}", tag],
                          capture_output=True, text=True).stdout.strip()
    size_text = f"{int(size) / 1e9:.2f} GB" if size.isdigit() else "unknown size"
    say(f"built {tag} in {seconds:.0f} s ({seconds / 60:.1f} min), {size_text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=["cpu", "gpu", "base"])
    parser.add_argument("--engine", default=os.environ.get("ENGINE", "auto"), choices=["auto", "docker", "podman"])
    parser.add_argument("--tag", help="image name (default hvdtrain:cpu / hvdtrain:gpu)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ca-certs", default=os.environ.get("CA_CERTS", "auto"),
                        help=f"extra CA certificates (a file or a folder of .crt/.pem); 'auto': "
                             f"{LOCAL_CA_DIR} when it holds any; 'none'")
    parser.add_argument("--offline-base", action="store_true",
                        help="make the base image with debootstrap first when it is not present locally")
    parser.add_argument("--no-host-wheels", action="store_true",
                        help="do not pass the host's torch and Horovod wheels into the build")
    parser.add_argument("--compile-horovod", action="store_true",
                        help="pass the host's torch wheel but not its Horovod wheel: the image compiles Horovod")
    parser.add_argument("--host-cache", type=Path, default=Path(os.environ.get(
        "HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain")), help="scripts/install-horovod's cache")
    args = parser.parse_args(argv)
    try:
        if args.variant == "base":
            make_base_image(pick_engine(args.engine), args.tag or DEFAULT_BASE)
        else:
            build(args)
    except BuildError as err:
        print(f"docker-build: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
