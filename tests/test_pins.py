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
