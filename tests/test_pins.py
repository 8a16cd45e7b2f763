"""One place is the source of the pins (envs/*.txt); environment.yml must agree with it."""
import os
import re

from runner.envs.definitions import ENVS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirement_pins(path):
    pins = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]+\])?==([^;\s]+)\s*(;.*)?$", line)
            assert m, "%s: not an exact pin: %r" % (os.path.basename(path), line)
            pins.setdefault(m.group(1).lower(), []).append((m.group(3), (m.group(4) or "").strip()))
    return pins


def test_environment_yml_has_the_runner_pins():
    runner = {name: versions[0][0] for name, versions in requirement_pins(os.path.join(ROOT, "envs", "runner.txt")).items()}
    with open(os.path.join(ROOT, "environment.yml")) as f:
        text = f.read()
    yml = dict(re.findall(r"^\s+- ([A-Za-z0-9_.\-]+)==(\S+)\s*$", text, flags=re.M))
    assert {k.lower(): v for k, v in yml.items()} == runner
    python = re.search(r"^\s+- python=(\S+)", text, flags=re.M).group(1)
    assert python == "3.11"


def test_every_environment_has_exact_pins_for_both_devices():
    for env in ENVS.values():
        for device in ("cpu", "cuda"):
            pins = requirement_pins(env.requirements(device))
            assert "ipykernel" in pins and "numpy" in pins, (env.name, device)


def test_cpu_and_cuda_pins_agree_on_shared_packages():
    """The two device variants differ only in the framework's build, not in the rest."""
    for env in ENVS.values():
        cpu = requirement_pins(env.requirements("cpu"))
        cuda = requirement_pins(env.requirements("cuda"))
        for name in set(cpu) & set(cuda):
            assert cpu[name] == cuda[name], (env.name, name, cpu[name], cuda[name])


def wheelhouse_commands():
    """The device wheelhouse's pip download commands that the pages give: (where, its requirement words)."""
    out = []
    for rel in ("docs/gpus.md", "tools/installed_offline.sh"):
        with open(os.path.join(ROOT, rel)) as f:          # a shell comment's lines without their "#"
            lines = [re.sub(r"^#\s?", "", line) if rel.endswith(".sh") else line for line in f.read().splitlines()]
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            if "pip download" in line and "--dest" in line:
                words = [w for w in line.split("#", 1)[0].split() if not w.startswith("-")]
                words = words[words.index("download") + 1:]
                out.append((rel, [w for w in words if re.match(r"^[A-Za-z][A-Za-z0-9_.\-]*(==\S+)?$", w)
                                  and not w.startswith(("manylinux", "cp"))]))
    return out


def test_the_device_wheelhouse_command_pins_what_the_runner_and_the_keras_rows_pin():
    """The wheels a GPU image lacks (docs/gpus.md, tools/installed_offline.sh) are the versions the tier tests:
    each name the runner pins is pinned to envs/runner.txt's version, keras to the Keras rows' (envs/jax-cuda.txt)."""
    pins = {name: versions[0][0] for name, versions in requirement_pins(os.path.join(ROOT, "envs", "runner.txt")).items()}
    pins["keras"] = requirement_pins(os.path.join(ROOT, "envs", "jax-cuda.txt"))["keras"][0][0]
    commands = wheelhouse_commands()
    assert [rel for rel, _ in commands] == ["docs/gpus.md", "tools/installed_offline.sh"], commands
    for rel, words in commands:
        named = dict((w.split("==") + [None])[:2] for w in words)
        assert {"papermill", "ipykernel", "keras"} <= set(named), (rel, words)
        wrong = {n: v for n, v in named.items() if n.lower() in pins and v != pins[n.lower()]}
        assert not wrong, "%s: not the pins of envs/runner.txt (keras: envs/jax-cuda.txt): %s" % (rel, wrong)
