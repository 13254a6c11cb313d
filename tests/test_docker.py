"""The container image's promises (docker/), checked without Docker, which cannot run on the CPU machines.

The GPU workflow (.github/workflows/docker.yml) builds the image and runs the tests inside it; here the
Dockerfile is parsed and the entrypoint is run in its dry-run mode: an official PyTorch CUDA base image
pinned by tag, a C and C++ compiler in it (torch.compile and Triton build code at run time) with the reason
stated and proven at build time, the course installed on the image's torch, a non-root user, Jupyter Lab
with a token that is never empty, bound to 0.0.0.0 inside the container and published on the host's
127.0.0.1 only, notebooks and data mounted from the host, and optional SSH with keys only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKER = REPO_ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
ENTRYPOINT = DOCKER / "entrypoint.sh"
SSHD_CONFIG = DOCKER / "sshd_config"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "docker.yml"
BASE_IMAGE = re.compile(r"^pytorch/pytorch:(\d+)\.(\d+)\.(\d+)-cuda\d+(\.\d+)*-cudnn\d+-(runtime|devel)$")
# Ways of handing Jupyter an empty token (which switches authentication off) or a password.
EMPTY_TOKEN = re.compile(
    r"""(token|JUPYTER_TOKEN)\s*=\s*(''|""|\s|$)|--no-token|\.password\s*=""", re.IGNORECASE | re.MULTILINE
)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    joined, out = "", []
    for line in path.read_text().splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        joined += line.rstrip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        word, _, args = joined.strip().partition(" ")
        out.append((word.upper(), " ".join(args.split())))
        joined = ""
    return out


def _final_stage() -> list[tuple[str, str]]:
    """The instructions of the last build stage (from its FROM on): what the image is made of."""
    instructions = _instructions(DOCKERFILE)
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _entrypoint(
    *args: str, env: dict[str, str | None] | None = None, home: Path | None = None
) -> subprocess.CompletedProcess:
    """Run docker/entrypoint.sh in its dry-run mode (prints what it would run) with `env`."""
    run_env = {
        **os.environ,
        "COURSE_ENTRYPOINT_DRY_RUN": "1",
        "VENV": str(Path(sys.executable).parent.parent),
        "HOME": str(home or REPO_ROOT / "build"),
        **(env or {}),
    }
    run_env = {k: v for k, v in run_env.items() if v is not None}
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env=run_env, capture_output=True, text=True, timeout=60
    )


def _documented_runs() -> list[str]:
    """Every `docker run` command written in docker/ and the workflow (comments too: they are the docs)."""
    text = "\n".join(p.read_text() for p in (*DOCKER.iterdir(), WORKFLOW) if p.is_file())
    text = re.sub(r"\\\n\s*#?", " ", text)  # continued lines, also inside comments
    return [m.group(0) for m in re.finditer(r"docker run[^\n]*", text)]


def test_dockerfile_parses() -> None:
    words = [w for w, _ in _instructions(DOCKERFILE)]
    assert words.count("FROM") >= 1 and "ENTRYPOINT" in words, words
    unknown = set(words) - {
        "FROM",
        "ARG",
        "ENV",
        "RUN",
        "COPY",
        "WORKDIR",
        "USER",
        "EXPOSE",
        "VOLUME",
        "HEALTHCHECK",
        "ENTRYPOINT",
        "CMD",
        "LABEL",
        "SHELL",
    }
    assert not unknown, f"unexpected instructions {unknown}: a continuation line was probably broken"


def test_base_image_is_pinned_official_pytorch_cuda() -> None:
    image = _final_stage()[0][1].split()[0]
    assert "$" not in image, f"FROM {image}: pin the base image literally, not through a build argument"
    assert BASE_IMAGE.match(image), (
        f"FROM {image}: use an official PyTorch CUDA image pinned by tag, "
        "e.g. pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime (never :latest)"
    )


def _apt_packages(stage: list[tuple[str, str]]) -> set[str]:
    """Every package an `apt-get install` of the stage names."""
    runs = " ".join(args for word, args in stage if word == "RUN")
    found: set[str] = set()
    for m in re.finditer(r"apt-get install ((?:-\S+ )*)([^&;|]+)", runs):
        found |= {w for w in m.group(2).split() if not w.startswith("-")}
    return found


def test_the_image_can_compile() -> None:
    """torch.compile writes C++ for the CPU, Triton builds a C launcher per GPU kernel: a -devel image has a
    compiler; a runtime image must install one. The Dockerfile says why, and proves it at build time."""
    stage = _final_stage()
    flavour = BASE_IMAGE.match(stage[0][1].split()[0]).group(5)
    packages = _apt_packages(stage)
    if flavour == "runtime":
        assert "build-essential" in packages or {"gcc", "g++"} <= packages, (
            f"a -runtime image has no C/C++ compiler: apt-get install build-essential "
            f"(got {sorted(packages)})"
        )
    text = DOCKERFILE.read_text()
    before_from = text[: text.index("\nFROM ")]
    assert re.search(r"torch\.compile", before_from) and "Triton" in before_from, (
        "say why the image needs a compiler")
    assert re.search(r"-devel", before_from) and re.search(r"\bsize", before_from), (
        "say what the choice between -devel and runtime + compiler costs in image size"
    )
    runs = " ".join(args for word, args in stage if word == "RUN")
    assert re.search(r"python -c \"[^\"]*torch\.compile\(", runs), (
        "prove at build time that the image compiles: run a torch.compile'd function once"
    )


def test_the_image_without_a_compiler_is_caught(monkeypatch, tmp_path) -> None:
    """The planted error: the former Dockerfile (runtime image, no compiler) fails the check above."""
    text = DOCKERFILE.read_text().replace(" build-essential", "")
    planted = tmp_path / "Dockerfile"
    planted.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "DOCKERFILE", planted)
    with pytest.raises(AssertionError, match=r"no C/C\+\+ compiler"):
        test_the_image_can_compile()


def test_base_image_torch_satisfies_the_course() -> None:
    image = _final_stage()[0][1].split()[0]
    version = tuple(int(x) for x in BASE_IMAGE.match(image).groups()[:3])
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)', pyproject)
    assert floor, "pyproject.toml has no torch>=X.Y requirement to compare with"
    assert version[:2] >= (int(floor.group(1)), int(floor.group(2))), (
        f"the image's torch {version} is older than the course's torch>={floor.group(1)}.{floor.group(2)}: "
        "pip would replace the image's CUDA build"
    )


def test_installs_the_course_on_the_image_torch() -> None:
    stage = _final_stage()
    runs = " ".join(args for word, args in stage if word == "RUN")
    env = " ".join(args for word, args in stage if word in ("ENV", "ARG"))
    assert "make setup" in runs, "install the course the way the README does: make setup"
    assert "COURSE_TORCH=keep" in runs + " " + env, "COURSE_TORCH=keep keeps the image's CUDA build of torch"
    assert "--system-site-packages" in runs, "the course's venv must see the image's torch"


def test_runs_as_a_non_root_user() -> None:
    users = [args for word, args in _final_stage() if word == "USER"]
    assert users, "no USER instruction: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]}: the container must not run as root"
    runs = " ".join(args for word, args in _final_stage() if word == "RUN")
    assert re.search(r"useradd[^&]*--uid", runs), "create the user with a UID (matchable to the host's)"


def test_no_password_anywhere() -> None:
    for path in DOCKER.iterdir():
        text = path.read_text()
        assert not re.search(r"chpasswd|echo[^\n|]*\|\s*passwd|PasswordAuthentication\s+yes", text), (
            f"{path.name} sets or allows a password"
        )
    runs = " ".join(args for word, args in _final_stage() if word == "RUN")
    for match in re.finditer(r"usermod[^&]*--password\s+(\S+)", runs):
        assert match.group(1).strip("'\"") in ("*", "!"), f"usermod sets a password: {match.group(0)}"


def test_lab_token_is_never_empty_or_baked_in() -> None:
    for path in [*DOCKER.iterdir(), WORKFLOW]:
        found = EMPTY_TOKEN.search(path.read_text())
        assert not found, f"{path.name}: {found.group(0)!r} would give Jupyter an empty token or a password"
    baked = [
        args for word, args in _instructions(DOCKERFILE) if word in ("ENV", "ARG") and "TOKEN" in args.upper()
    ]
    assert not baked, f"a token baked into the image is shared by everyone who pulls it: {baked}"
    for token in (None, ""):  # unset, or set but empty: a random token either way
        out = _entrypoint(env={"JUPYTER_TOKEN": token})
        assert out.returncode == 0, out.stderr
        assert "token: 48 characters" in out.stdout, out.stdout
        assert re.search(r"token=[0-9a-f]{48}\b", out.stdout), "a generated token must be shown to the user"
    out = _entrypoint(env={"JUPYTER_TOKEN": "chosen-by-the-user"})
    assert "token: 18 characters" in out.stdout and "chosen-by-the-user" not in out.stdout, out.stdout


def test_lab_binds_all_interfaces_inside_the_container_only() -> None:
    out = _entrypoint()
    command = next(line for line in out.stdout.splitlines() if line.startswith("would run:") and "lab" in line
                   and "copy_lessons" not in line)
    assert "jupyter lab" in command and "--ServerApp.ip=0.0.0.0" in command, command
    assert "--notebook-dir=/workspace/my-lessons" in command, command  # a copy: your edits, not the release
    assert not re.search(
        r"token|password|disable_check_xsrf|allow_origin", command.split("jupyter lab", 1)[1]
    ), command
    runs = _documented_runs()
    published = [p for run in runs for p in re.findall(r"(?:-p|--publish)[ =](\S+)", run)]
    assert published, f"no documented `docker run -p ...`: {runs}"
    open_ports = [p for p in published if not p.startswith("127.0.0.1:")]
    assert not open_ports, (
        f"publish ports on the host's loopback only (-p 127.0.0.1:8888:8888), not {open_ports}"
    )


def test_your_lessons_and_data_come_from_the_host() -> None:
    """Lab works on a copy of the lessons mounted from the host (issue 40): the image's notebooks/ are never
    where your edits land, as with `make lab`."""
    volumes = " ".join(args for word, args in _final_stage() if word == "VOLUME")
    assert "/workspace/notebooks" not in volumes, "the tracked lessons must not be a volume your edits go to"
    for path in ("/workspace/my-lessons", "/workspace/data"):
        assert path in volumes, f"VOLUME must list {path}: {volumes!r}"
    out = _entrypoint()
    copy = next(line for line in out.stdout.splitlines() if "copy_lessons.py" in line)
    assert copy.endswith("/workspace/notebooks /workspace/my-lessons"), copy
    runs = " ".join(_documented_runs())
    for path in ("/workspace/my-lessons", "/workspace/data"):
        assert re.search(rf"-v \S+:{path}\b", runs), (
            f"the documented docker run must mount {path} from the host"
        )


def test_ssh_is_keys_only() -> None:
    config = {}
    for line in SSHD_CONFIG.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            config[key.lower()] = value.strip().lower()
    for key, wanted in [
        ("passwordauthentication", "no"),
        ("kbdinteractiveauthentication", "no"),
        ("permitemptypasswords", "no"),
        ("permitrootlogin", "no"),
        ("pubkeyauthentication", "yes"),
    ]:
        assert config.get(key) == wanted, f"sshd_config: {key} must be {wanted}, got {config.get(key)!r}"


def test_ssh_needs_a_key_and_is_off_by_default(tmp_path: Path) -> None:
    assert "sshd" not in _entrypoint(home=tmp_path).stdout, "sshd must start only with ENABLE_SSH=1"
    out = _entrypoint(env={"ENABLE_SSH": "1", "SSH_AUTHORIZED_KEYS": None}, home=tmp_path)
    assert out.returncode != 0 and "no public key" in out.stderr, (out.returncode, out.stderr)
    assert "sshd -f" not in out.stdout and "jupyter" not in out.stdout, "nothing may start without a key"
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ2kZ8sY5w3X0x2JmUwWl0c9a1Q0s4e8GqZfWm1yQm5v learner@laptop"
    out = _entrypoint(env={"ENABLE_SSH": "1", "SSH_AUTHORIZED_KEYS": key}, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"sshd -f /etc/ssh/course_sshd_config -h \S+", out.stdout), out.stdout
    assert (tmp_path / ".ssh" / "authorized_keys").read_text().strip() == key


@pytest.mark.skipif(
    not Path("/usr/sbin/sshd").exists(),
    reason="OpenSSH server not installed here (apt-get install openssh-server)",
)
def test_sshd_accepts_the_config(tmp_path: Path) -> None:
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    out = subprocess.run(
        ["/usr/sbin/sshd", "-T", "-f", str(SSHD_CONFIG), "-h", str(key)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if "privilege separation directory" in out.stderr:
        pytest.skip(f"sshd cannot check its config here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    effective = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert effective["passwordauthentication"] == "no" and effective["pubkeyauthentication"] == "yes"


def test_entrypoint_runs_other_commands() -> None:
    assert shutil.which("bash")
    syntax = subprocess.run(["bash", "-n", str(ENTRYPOINT)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    out = _entrypoint("make", "test")
    assert out.returncode == 0 and "would run: make test" in out.stdout, out.stdout + out.stderr
    words = dict(_instructions(DOCKERFILE))
    assert "course-entrypoint" in words["ENTRYPOINT"] and "lab" in words["CMD"], (
        words["ENTRYPOINT"],
        words["CMD"],
    )


def test_build_context_leaves_local_state_out() -> None:
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    for path in (".venv", ".git", "build"):
        assert path in ignored, f"docker/Dockerfile.dockerignore must exclude {path}"


def test_gpu_workflow_builds_the_image_and_tests_inside_it() -> None:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = list(workflow["jobs"].values())
    assert jobs, "the workflow has no job"
    job = jobs[0]
    labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
    assert "self-hosted" in labels and "gpu" in labels, f"runs-on {labels}: a self-hosted GPU runner"
    steps = " ".join(step.get("run", "") for step in job["steps"])
    assert "nvidia-smi" in steps, "check the runner's GPU first"
    assert re.search(r"docker build -f docker/Dockerfile", steps), "build docker/Dockerfile"
    assert re.search(r"docker run[^\n]*--gpus all[^\n]*make test", steps), (
        "run `make test` inside the image on the GPU"
    )
    assert "torch.cuda.is_available()" in steps, "assert CUDA works inside the container"
