"""adapters/uv_install.py: the machine's pip configuration, as `pip config list` prints it, becomes uv's options."""

from __future__ import annotations

from adapters import uv_install

# this machine's listing (2026-11-28): find-links and cert both from a file and from PIP_* variables
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_every_index_find_links_folder_and_constraint_reaches_uv() -> None:
    options, env = uv_install.uv_options(uv_install.pip_config(LISTING))
    assert options == ["--index-strategy", "unsafe-best-match", "--find-links", "/opt/wheels",
                       "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                       "--constraint", "/etc/xdg/pip/constraints.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def test_a_pip_variable_overrides_the_install_section_which_overrides_global() -> None:
    listing = ("global.index-url='https://a.example/simple'\ninstall.index-url='https://b.example/simple'\n"
               ":env:.index-url='https://c.example/simple'\nglobal.no-index='false'\n")
    assert uv_install.pip_config(listing) == {"index-url": "https://c.example/simple", "no-index": "false"}
    options, _ = uv_install.uv_options(uv_install.pip_config(listing))
    assert options[-2:] == ["--index-url", "https://c.example/simple"] and "--no-index" not in options


def test_no_configuration_leaves_uv_its_defaults() -> None:
    assert uv_install.uv_options(uv_install.pip_config("")) == (["--index-strategy", "unsafe-best-match"], {})
    assert "--no-index" in uv_install.uv_options({"no-index": "true"})[0]
