"""The documented offline install (docs/python.md): a venv with --system-site-packages (Debian's torch,
numpy, pip and setuptools), then pip install --no-build-isolation --no-index of python/, editable and
not. Run on a copy of python/: setuptools writes build/ and attnres.egg-info/ beside the sources
(ignored by .gitignore in the real tree)."""
import os
import shutil
import subprocess
import sys
import unittest

import support

CHECK = """
import os, sys, attnres, torch
from attnres import AttnResModel, ModelConfig
assert os.path.realpath(attnres.__file__).startswith(os.path.realpath(sys.argv[1])), attnres.__file__
m = AttnResModel(ModelConfig(vocab_size=257, d_model=16, n_layers=2, n_heads=2, mlp_hidden=32, residual="rd"))
attnres.save(m, "model.safetensors", tokenizer="bytes")
m = attnres.load(".")
logits, reads = m(torch.zeros(1, 4, dtype=torch.long), return_weights=True)
assert logits.shape == (1, 4, 257) and len(reads) == 5
print("ok", attnres.__version__, attnres.make_tokenizer("bytes").encode("hi"))
"""


def run(cmd, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


class InstallTest(unittest.TestCase):
    def test_install_then_editable_install(self):
        tmp = support.TempDir("install")
        self.addCleanup(tmp.cleanup)
        shutil.copytree(os.path.join(support.SOURCE_DIR, "python"), tmp("src", "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        r = subprocess.run([python, "-m", "venv", "--system-site-packages", tmp("venv")], capture_output=True,
                           text=True)
        if r.returncode != 0:
            self.fail("python3 -m venv failed (scripts/install-deps.sh installs python3-venv):\n" + r.stderr)
        pip = [tmp("venv", "bin", "pip"), "install", "--no-build-isolation", "--no-index"]
        os.makedirs(tmp("work"))
        run(pip + ["python/"], cwd=tmp("src"))
        out = run([tmp("venv", "bin", "python"), "-c", CHECK, tmp("venv", "lib")], cwd=tmp("work"))
        self.assertIn("ok 0.1.0 [104, 105]", out)
        run(pip + ["-e", "python/"], cwd=tmp("src"))  # replaces the installed copy
        out = run([tmp("venv", "bin", "python"), "-c", CHECK, tmp("src", "python")], cwd=tmp("work"))
        self.assertIn("ok 0.1.0", out)


if __name__ == "__main__":
    unittest.main()
