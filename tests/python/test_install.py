"""The documented offline install (docs/python.md, "Install"), run as the page writes it: its venv line (Debian's
/usr/bin/python3, --system-site-packages: Debian's torch, numpy, pip and setuptools), then its pip install
--no-build-isolation --no-index of python/, not editable and editable. A `python3` first on the PATH that is not
Debian's (pyenv, conda) must not matter: the commands run with one that fails. The README's one-line form is
the same commands. Run on a copy of python/: setuptools writes build/ and attnres.egg-info/ beside the sources
(ignored by .gitignore in the real tree)."""
import os
import re
import shutil
import subprocess
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


def documented_commands():
    """The shell lines of the first ```sh block of docs/python.md's "## Install" section."""
    with open(os.path.join(support.SOURCE_DIR, "docs", "python.md")) as f:
        page = f.read()
    section = page[page.index("## Install"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def run(cmd, cwd, path_dir):
    """Runs a shell line (or an argument list) with `path_dir` (a non-Debian python3) first on the PATH, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = path_dir + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    r = subprocess.run(cmd, shell=isinstance(cmd, str), cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{cmd if isinstance(cmd, str) else ' '.join(cmd)} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r.stdout


class InstallTest(unittest.TestCase):
    def test_the_documented_install_then_editable_install(self):
        venv, pip, check = documented_commands()
        self.assertTrue(venv.endswith(" -m venv --system-site-packages .venv"), venv)
        self.assertTrue(pip.startswith(".venv/bin/pip install --no-build-isolation --no-index -e python/"), pip)
        self.assertTrue(check.startswith(".venv/bin/python -c "), check)
        # The README gives the same two commands, joined by &&.
        with open(os.path.join(support.SOURCE_DIR, "README.md")) as f:
            readme = " ".join(f.read().split())
        self.assertIn(f"`{venv} && {pip}`", readme)

        tmp = support.TempDir("install")
        self.addCleanup(tmp.cleanup)
        shutil.copytree(os.path.join(support.SOURCE_DIR, "python"), tmp("src", "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        # A python3 on the PATH that is not Debian's (as pyenv's or conda's would be, without torch).
        os.makedirs(tmp("other"))
        with open(tmp("other", "python3"), "w") as f:
            f.write("#!/bin/sh\necho 'not Debian python3' >&2\nexit 3\n")
        os.chmod(tmp("other", "python3"), 0o755)
        work = tmp("src")
        run(venv, work, tmp("other"))
        os.makedirs(tmp("work"))
        python = os.path.join(work, ".venv", "bin", "python")
        run(pip.replace(" -e ", " "), work, tmp("other"))  # a copy first
        out = run([python, "-c", CHECK, os.path.join(work, ".venv", "lib")], tmp("work"), tmp("other"))
        self.assertIn("ok 0.1.0 [104, 105]", out)
        run(pip, work, tmp("other"))  # as documented: editable, replacing the copy
        self.assertEqual(run(check, work, tmp("other")).strip(), "0.1.0")
        out = run([python, "-c", CHECK, tmp("src", "python")], tmp("work"), tmp("other"))
        self.assertIn("ok 0.1.0", out)

if __name__ == "__main__":
    unittest.main()
