"""Components from outside the repository: the modules that register them, imported by name.

A package outside this repository adds a component with :func:`strategies.register` in
one of its modules and names that module in one of two places:

- an entry point of the group ``growbench.components`` in its own ``pyproject.toml``::

      [project.entry-points."growbench.components"]
      median = "my_package.median_averaging"

- or the environment variable ``GROWBENCH_PLUGINS`` (module names, comma-separated),
  for a module that is not an installed package.

The CLI imports them before it reads any spec. Every worker process of a sweep imports
the modules that registered a component in the process that started it
(:func:`strategies.registry.outside_modules`), so an outside component runs everywhere a
built-in one does.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "growbench.components"
ENV_VAR = "GROWBENCH_PLUGINS"


class PluginError(ValueError):
    """A named plugin module cannot be imported."""


def plugin_modules() -> list[str]:
    """The module names the entry points and ``GROWBENCH_PLUGINS`` name, in that order, once each."""
    names = [ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


def load_plugins(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Import every plugin module (and ``extra`` ones), so that their components are registered.

    Parameters
    ----------
    extra : list of str
        More module names, e.g. those :func:`strategies.registry.outside_modules` lists in
        the process that started a sweep.

    Returns
    -------
    list of str
        The modules imported (importing one twice is free: Python caches modules).

    Raises
    ------
    PluginError
        One line naming the module and where it was named, when it cannot be imported.
    """
    return import_modules([*plugin_modules(), *extra])


def import_modules(names: list[str] | tuple[str, ...]) -> list[str]:
    """Import ``names`` once each, in order (what :func:`load_plugins` does after finding them).

    Raises
    ------
    PluginError
        One line naming the module that cannot be imported: whatever it raised, ``SystemExit``
        (``sys.exit(0)`` at import) included, which would otherwise end the command with status 0
        having done nothing. Only ``KeyboardInterrupt`` passes through.
    """
    names = list(dict.fromkeys(names))
    for name in names:
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise  # the user's Ctrl-C, not the plugin's doing
        except BaseException as e:  # noqa: BLE001 - SystemExit too: a plugin must not end growbench, least of all as success
            what = f"{type(e).__name__}({e.code!r})" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
            raise PluginError(f"plugin module {name!r} (from the entry point group {ENTRY_POINT_GROUP!r}, "
                              f"{ENV_VAR} or the parent process) cannot be imported: {what}") from None
    return names
