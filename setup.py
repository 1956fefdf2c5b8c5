"""tepo-verl: TEPO (Token-Level Policy Optimization) as a verl plugin.

`pip install -e .` registers the `verl.plugins` entry point, so `import verl` alone loads TEPO in the
driver, the trainer and every Ray worker process.
"""

import runpy
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
# The extras (reward, report, trainer, test) are listed once, in tepo_verl/extras.py, which also names the missing
# extra at run time; it is read here by path, as nothing is installed yet.
EXTRAS = runpy.run_path(str(HERE / "tepo_verl" / "extras.py"))

# The verl range this plugin is tested against; `tepo_verl.verl_adapter.version_check` enforces it at run time.
VERL_REQUIREMENT = "verl>=0.9.0,<0.10"

setup(
    name="tepo-verl",
    version="0.1.0",
    description="TEPO (Token-Level Policy Optimization, ACL 2026) for verl: a documented reconstruction",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # The plugin alone: the CPU mode, the tiny models and the demo are the lab's (lab/setup.py, package tepo_lab).
    packages=find_packages(include=["tepo_verl", "tepo_verl.*"]) + ["hydra_plugins.tepo_verl_searchpath"],
    package_data={"tepo_verl": ["config/algorithm/*.yaml"]},
    install_requires=[
        # What loading and running the loss needs. torch is deliberately not listed: verl brings it, and a bare
        # `torch` requirement would let pip pull a multi-GB CUDA build over an installed CPU one. Install the torch
        # build you want first.
        VERL_REQUIREMENT,
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "packaging",
    ],
    extras_require=EXTRAS["extras_require"](),
    entry_points={
        "console_scripts": ["tepo-verl = tepo_verl.cli:main"],
        # verl imports every entry point of this group from `import verl` (verl/__init__.py).
        "verl.plugins": ["tepo = tepo_verl.verl_adapter.entrypoint"],
    },
)
