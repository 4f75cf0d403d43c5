"""The report's two renderings of one :class:`~harness.report.sections.Report`: a self-contained HTML page
and Markdown, from the Jinja2 templates ``templates/report.html.j2`` and ``templates/report.md.j2``.

HTML escaping is Jinja2's autoescape (on for every ``*.html.j2`` template): every string from the
database is escaped. Markdown has no such mode, so its template passes every text through a filter
of this module: :func:`markdown_text` for prose and table cells, :func:`markdown_code` for a code span,
:func:`markdown_link` for a link's target and :func:`markdown_fence` for a fenced block's fence. Names,
paths and error texts from the database (or from a plugin's component names) then give no raw HTML,
end no code span or fence early and start no new block, whatever backticks, blank lines or markup
they hold.
"""

from __future__ import annotations

import base64
import html
import re
import urllib.parse

import jinja2
import markupsafe

from growbench.harness.report.sections import Report

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("growbench.harness.report", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
)


# Markdown's line endings (CommonMark: LF, CR LF, CR): one in a text would start a new line, two a new block.
_LINE_BREAK = re.compile(r"\r\n?|\n")


def _one_line(text: object) -> str:
    return _LINE_BREAK.sub(" ", "" if text is None else str(text))


def markdown_text(text: object) -> str:
    """Text from the database made inert in Markdown: one line (a blank line would end the block), no HTML
    (``<``, ``>``, ``&`` as entities), no table breaks, emphasis, code spans or links (backslash-escaped)."""
    return (html.escape(_one_line(text), quote=False).replace("\\", "\\\\").replace("|", r"\|")
            .replace("`", r"\`").replace("*", r"\*").replace("[", r"\["))


def markdown_code(text: object) -> str:
    """A whole Markdown code span of ``text``, delimiters included: on one line, its backticks kept.

    The span is delimited by one backtick more than the longest run in the text (CommonMark), so that
    no backtick in it ends it; inside a code span ``<`` and ``&`` are literal, never HTML.
    """
    text = _one_line(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""  # a backtick next to the fence would join it
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_link(target: object) -> str:
    """A link's target (a file beside the report), percent-encoded: spaces, brackets and markup cannot end it."""
    return urllib.parse.quote(_one_line(target), safe="/._-~")


def markdown_fence(text: object) -> str:
    """The fence of a fenced code block holding ``text``: backticks, longer than any run in it (at least 3)."""
    return "`" * max(3, max((len(run) + 1 for run in re.findall(r"`+", str(text))), default=0))


def markdown_anchor(title: str) -> str:
    """The anchor Markdown viewers (GitHub, GitLab) give a heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


#: Where a spec (``gram/ridge/full+metric/normal+holdout:bracket``) or a dataset with options
#: (``minilm-recovery:layer=4:head=7``) may wrap: after a ``/``, ``+`` or ``:`` between two parts of a name. A word
#: character (or a closing bracket) before it and a letter after it keep signs (``+0.66``), ``</`` and ``: `` out.
_JOINT = re.compile(r"(?<=[\w\])])([/+:])(?=[A-Za-z_])")
#: A run of text without spaces, as HTML-escaped text holds it.
_WORD = re.compile(r"[^\s]+")


def has_joints(text: object) -> bool:
    """Whether ``text`` holds a name that :func:`html_breakable` lets wrap (a spec, a dataset with options)."""
    return bool(_JOINT.search("" if text is None else str(text)))


def html_breakable(text: object) -> markupsafe.Markup:
    """``text`` HTML-escaped, each spec-like word wrapping only after its ``/``, ``+`` and ``:``.

    The parts of such a word go in ``<span class="nw">`` (no wrap inside) with ``<wbr>`` between them, so that a
    narrow window breaks ``gram/ridge/full+metric/normal+holdout:bracket`` into whole components, never inside
    one (``normal+hol|dout``) nor after a hyphen (``mean-|input``); copied, the text is unchanged.
    """
    escaped = str(markupsafe.escape("" if text is None else text))

    def split(word: re.Match) -> str:
        parts = _JOINT.split(word.group(0))
        if len(parts) == 1:
            return word.group(0)
        # split() keeps the joints at odd places: each part ends with the joint that follows it.
        pieces = [parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)]
        return "<wbr>".join(f'<span class="nw">{piece}</span>' for piece in pieces if piece)

    return markupsafe.Markup(_WORD.sub(split, escaped))


def html_header(text: object) -> markupsafe.Markup:
    """A table header HTML-escaped, which may wrap after each ``_`` (``line_search_ms``), ``/``, ``+`` and ``:``
    besides its spaces: a column's header must not make it wider than its numbers."""
    escaped = str(markupsafe.escape("" if text is None else text))
    return markupsafe.Markup(_JOINT.sub(r"\1<wbr>", escaped).replace("_", "_<wbr>"))


def base64_text(data: bytes) -> str:
    """``data`` as base64 text (a PNG embedded in the HTML page)."""
    return base64.b64encode(data).decode("ascii")


ENVIRONMENT.filters.update(md=markdown_text, md_code=markdown_code, md_link=markdown_link, md_fence=markdown_fence,
                           md_anchor=markdown_anchor, b64=base64_text, wrap=html_breakable,
                           header=html_header)
ENVIRONMENT.tests.update(joints=has_joints)


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page: figures embedded, inline CSS, no external resource."""
    return ENVIRONMENT.get_template("report.html.j2").render(report=report)


def render_markdown(report: Report) -> str:
    """The report as Markdown, linking its figures as ``figures/<name>.png``."""
    # Every block ends with a blank line; the file ends with one newline.
    return ENVIRONMENT.get_template("report.md.j2").render(report=report).rstrip("\n") + "\n"
