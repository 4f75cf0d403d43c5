"""Writing ``strategies/default.json``: one choice per regime, with its evidence, keeping what the file already holds.

One module of the recommendation (:mod:`harness.recommend` lists them all). ``growbench recommend --write``
replaces the entries of the regimes its database has evidence for and nothing else:

- the entries of other regimes stay as they are (but for the database they name, by its file name, in those it
  can read), also those this process cannot read (a plugin strategy's spec with ``GROWBENCH_PLUGINS`` unset, a
  regime key of a newer growbench), byte for byte in JSON terms: the reader of the file (:mod:`strategies.spec`)
  warns about them, the writer must not delete them;
- top-level keys other than the ones it writes (``rule``, ``regimes``, ``db``, ``generated``) stay too;
- a file it cannot read as a JSON object (damaged, not UTF-8, a FIFO, a folder) is refused in one line naming
  it, and left untouched: replacing it would lose what it held.

The database is recorded by its file name only (:func:`database_label`): an absolute path names one machine's
folder (often a temporary one), and a file committed with it would differ from machine to machine.
"""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path

from growbench import strategies
from growbench.harness.files import replace_file
from growbench.harness.rule.choice import Recommendation
from growbench.strategies.regimes import Regime, all_regimes
from growbench.strategies.spec import REFERENCE_REGIME, check_default_choice

#: The top-level keys ``write_default`` writes; any other key of the file is kept as it is.
OWN_KEYS = ("rule", "regimes", "db", "generated")


def default_file() -> Path:
    """``strategies/default.json`` of the installed package."""
    return Path(strategies.__file__).resolve().parent / "default.json"


def database_label(db: str | Path) -> str:
    """How a default file or a report records the database its evidence comes from: its file name.

    The same database gives the same label on every machine and in every folder (``/tmp/x/growbench.sqlite`` and
    ``results/growbench.sqlite`` both give ``growbench.sqlite``).
    """
    return Path(db).name


def write_default(recs: Recommendation | dict[str, Recommendation], db: str | Path,
                  path: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write one choice per regime into ``strategies/default.json`` (or ``path``), which
    ``strategies.make("default")`` reads, keeping everything else the file holds (see the module docstring).

    The file is written to a temporary file beside it and renamed over it (never through a symlink
    at ``path``, and a kill leaves the old file whole).

    Parameters
    ----------
    recs : Recommendation or dict
        ``{regime key: Recommendation}`` (a single recommendation counts for its own regime).
    db : str or Path
        The database the evidence comes from (recorded by its file name).
    path : str or Path, optional
        Where to write; default the package's ``default.json``.

    Returns
    -------
    (Path, list of str)
        The file, and one line per regime whose entry changed, was added or was kept from the file.

    Raises
    ------
    ValueError
        One line, nothing written: a regime has no choice, or it is ``default`` itself or a baseline
        (:func:`~strategies.spec.check_default_choice`); or the file at ``path`` exists but cannot be read as a
        JSON object whose ``regimes`` is an object.
    """
    if isinstance(recs, Recommendation):
        recs = {recs.regime or REFERENCE_REGIME.key: recs}
    path = Path(path) if path else default_file()
    for key, rec in recs.items():
        if rec.spec is None:
            raise ValueError(f"not written to {path}: no growth strategy is eligible in {key}")
        try:
            # The same check as on load: a recursive ("default") or baseline choice would only be
            # replaced by the built-in default, with a warning, every time the file is read.
            check_default_choice(rec.spec)
        except ValueError as e:
            raise ValueError(f"not written to {path}: {e}") from None
    old = read_existing(path)
    shipped = old.get("regimes", {})
    label = database_label(db)
    regimes = {key: _portable(key, entry) for key, entry in shipped.items() if key not in recs}
    regimes.update({key: rec.as_json(label) for key, rec in recs.items()})
    changes = {key: _change(key, shipped.get(key), rec) for key, rec in recs.items()}
    changes.update({key: _kept(key, entry) for key, entry in shipped.items() if key not in recs})
    data = {"rule": next(iter(recs.values())).rule, "regimes": {key: regimes[key] for key in _ordered(regimes)},
            "db": label, "generated": datetime.now(UTC).isoformat(timespec="seconds"),
            **{key: value for key, value in old.items() if key not in OWN_KEYS}}
    replace_file(path, json.dumps(data, indent=2) + "\n")
    return path, [changes[key] for key in _ordered(changes)]


def read_existing(path: Path) -> dict:
    """The default file at ``path`` as a JSON object (``{}`` when there is none), its ``regimes`` an object.

    Raises
    ------
    ValueError
        One line naming the file: it exists but is not a regular file (a FIFO would block the read), cannot be
        read, is not JSON, not a JSON object, or its ``regimes`` is not an object. Replacing such a file would
        lose what it holds, so nothing is written.
    """
    where = f"not written to {path}"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{where}: it is not a regular file (a folder, FIFO or device); remove it or give "
                         "--default-file another path")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: cannot read it ({type(e).__name__}); fix or move it first, nothing it holds "
                         "is overwritten") from None
    except (json.JSONDecodeError, RecursionError):
        raise ValueError(f"{where}: it is not valid JSON; fix or move it first, nothing it holds is "
                         "overwritten") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: it holds a JSON {type(data).__name__}, not an object; fix or move it first")
    if "regimes" in data and not isinstance(data["regimes"], dict):
        raise ValueError(f'{where}: its "regimes" is not a JSON object; fix or move it first')
    return data


def _problem(key: str, entry: object) -> str:
    """Why this process cannot read the entry ``key`` of a default file ("" when it can)."""
    try:
        Regime.parse(key)
        check_default_choice(entry.get("spec") if isinstance(entry, dict) else None)
    except ValueError as e:
        return str(e).replace("\n", " ")
    return ""


def _spec(entry: object) -> str:
    """An entry's spec as the file holds it, for a message."""
    return str(entry.get("spec")) if isinstance(entry, dict) else json.dumps(entry)[:60]


def _change(key: str, old: object, rec: Recommendation) -> str:
    """The line that says what became of regime ``key``, which this database has evidence for."""
    if old is None:
        was = "added"
    elif _problem(key, old):
        was = f"was {_spec(old)}, which this process cannot read"
    else:
        was = "unchanged" if old.get("spec") == rec.spec else f"was {old.get('spec')}"
    return f"{key}: {rec.spec} ({was}; {rec.verdict})"


def _kept(key: str, entry: object) -> str:
    """The line that says regime ``key``'s entry was kept, and whether this process can read it."""
    problem = _problem(key, entry)
    if problem:
        return f"{key}: kept as it is (this process cannot read it: {problem}; no evidence in this database)"
    return f"{key}: kept {entry.get('spec')} (no evidence in this database)"


def _portable(key: str, entry: object) -> object:
    """A kept entry as it is, but for the database it names, by its file name (:func:`database_label`), when this
    process can read it: files written before named it by an absolute, often temporary, path."""
    if _problem(key, entry) or not isinstance(entry.get("db"), str):
        return entry
    return {**entry, "db": database_label(entry["db"])}


def _ordered(regimes: dict) -> list[str]:
    """The keys of ``regimes``: known regimes in their order (cpu first, narrowest band first), then the others as
    they come."""
    known = [r.key for r in all_regimes() if r.key in regimes]
    return known + [key for key in regimes if key not in known]
