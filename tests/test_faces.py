"""The packages' names, imported when first asked for (``mldserver/faces.py``): asking
for one imports its module and no other; a name a package does not offer is an
AttributeError naming the package."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mldserver
from mldserver.faces import lazy_attributes


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_mldserver_imports_none_of_the_server_until_a_name_is_asked_for():
    code = ("import sys, mldserver, mldserver.server, mldserver.protocol\n"
            "print(sorted(m for m in sys.modules if m.startswith('mldserver.server.') or m == 'mldserver.api.handler'))\n"
            "mldserver.server.Server\n"
            "print('mldserver.server.server' in sys.modules)\n")
    assert run(code).splitlines() == ["[]", "True"]


def test_a_packages_submodules_are_not_shadowed_by_its_face():
    # (``from ..faces import lazy`` once made ``from mldserver.protocol import lazy`` the
    # function, not protocol/lazy.py)
    code = "from mldserver.protocol import lazy\nprint(lazy.__name__)\n"
    assert run(code) == "mldserver.protocol.lazy"


def test_a_name_is_its_modules_own_object_and_kept_in_the_package():
    from mldserver.api.handler import Handler
    assert mldserver.Handler is Handler and mldserver.__dict__["Handler"] is Handler
    assert mldserver.timers.__name__ == "mldserver.timers"  # a submodule, as the module


def test_a_name_the_package_does_not_offer_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'mldserver.server' has no attribute 'Sever'"):
        import mldserver.server
        mldserver.server.Sever  # noqa: B018
    getattr_ = lazy_attributes("mldserver", {"Nothing": ".errors"})
    with pytest.raises(AttributeError, match="Nothing"):
        getattr_("Nothing")  # the module is there, the name is not
