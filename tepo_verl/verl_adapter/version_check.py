"""The verl versions this plugin is tested with, enforced when the plugin loads."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version

#: Keep in step with setup.py's VERL_REQUIREMENT. verl 0.8 and older have no `verl.plugins` entry points (so
#: `import verl` never loads this plugin) and a different trainer.
SUPPORTED_RANGE = ">=0.9.0,<0.10"
SUPPORTED_VERL = SpecifierSet(SUPPORTED_RANGE)
#: The releases CI tests on: the whole suite on 0.9.1, the tests marked verl_090 on 0.9.0 (docs/testing.md).
TESTED_RELEASES = ("0.9.0", "0.9.1")


class UnsupportedVerlVersion(RuntimeError):
    pass


def unsupported_message(installed: str) -> str:
    """One line: the installed verl, the supported range and the install command."""
    return (f"tepo-verl supports verl {SUPPORTED_RANGE} (tested with {' and '.join(TESTED_RELEASES)}); installed "
            f"verl is {installed}. Install a supported verl: pip install 'verl{SUPPORTED_RANGE}'")


def installed_verl() -> str | None:
    try:
        return version("verl")
    except PackageNotFoundError:
        return None


def check_verl_version(installed: str | None = None) -> str:
    """Return the installed verl version, or raise UnsupportedVerlVersion naming it and the supported range."""
    if installed is None:
        installed = installed_verl()
        if installed is None:
            raise UnsupportedVerlVersion("tepo-verl needs verl, which is not installed")
    if Version(installed) not in SUPPORTED_VERL:
        raise UnsupportedVerlVersion(unsupported_message(installed))
    return installed
