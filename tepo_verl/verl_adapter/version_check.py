"""The verl versions this plugin is tested with, enforced when the plugin loads."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: Keep in step with setup.py's VERL_REQUIREMENT. Tested: verl 0.9.1.
SUPPORTED_VERL = SpecifierSet(">=0.9.1,<0.10")


class UnsupportedVerlVersion(RuntimeError):
    pass


def check_verl_version(installed: str | None = None) -> str:
    """Return the installed verl version, or raise UnsupportedVerlVersion naming it and the supported range."""
    if installed is None:
        try:
            installed = version("verl")
        except PackageNotFoundError:
            raise UnsupportedVerlVersion("tepo-verl needs verl, which is not installed") from None
    if Version(installed) not in SUPPORTED_VERL:
        raise UnsupportedVerlVersion(
            f"tepo-verl supports verl {SUPPORTED_VERL} (tested with 0.9.1); installed verl is {installed}. "
            f"Install a supported verl: pip install 'verl{SUPPORTED_VERL}'"
        )
    return installed
