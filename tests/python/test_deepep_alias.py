"""The opt-in `deep_ep` alias (plugins/torch/deep_ep_alias) and its installer
(scripts/install-deep-ep-alias): it installs into a virtual environment of its own, where
`import deep_ep` is fusco.deep_ep and the call-site tests pass through that name; it refuses an
environment whose `deep_ep` is anything else (a real DeepEP)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INSTALL = os.path.join(REPO, "scripts", "install-deep-ep-alias")


def _install(venv):
    return subprocess.run([INSTALL, str(venv)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, FUSCO_PYTHON=sys.executable))


def test_alias_installs_into_its_own_environment_and_serves_the_call_sites(tmp_path):
    venv = tmp_path / "venv"
    r = _install(venv)
    assert r.returncode == 0, r.stdout + r.stderr
    py = str(venv / "bin" / "python")
    probe = ("import deep_ep, deep_ep.utils; "
             "assert deep_ep.Buffer.__module__ == 'fusco.deep_ep.buffer'; "
             "assert deep_ep.utils.EventOverlap.__module__ == 'fusco.deep_ep.utils'; "
             "print('ok')")
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=str(tmp_path),
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    env = dict(os.environ, DEEP_EP_MODULE="deep_ep")
    run = subprocess.run([py, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          os.path.join(HERE, "test_deepep_callsites.py"), "-k",
                          "cpu and (vllm_ll or megatron)"],
                         capture_output=True, text=True, cwd=HERE, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout
    again = _install(venv)  # reinstalling over the alias itself is fine
    assert again.returncode == 0, again.stderr


def test_alias_refuses_an_environment_with_another_deep_ep(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    real = os.path.join(site, "deep_ep")
    os.makedirs(real)
    with open(os.path.join(real, "__init__.py"), "w") as f:
        f.write("REAL_DEEP_EP = True\n")
    r = _install(venv)
    assert r.returncode != 0
    assert "already has a deep_ep" in r.stderr and "not fusco's alias" in r.stderr
    assert sorted(os.listdir(real)) == ["__init__.py"], "the real package is left as it was"
