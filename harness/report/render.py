"""The report's two renderings of one :class:`~harness.report.sections.Report`: a self-contained HTML page
and Markdown, from the Jinja2 templates ``templates/report.html.j2`` and ``templates/report.md.j2``.

HTML escaping is Jinja2's autoescape: every string from the database is escaped. Markdown has no
such mode, so its template passes every text through :func:`markdown_text`.
"""

from __future__ import annotations

import base64
import html
import re

import jinja2

from harness.report.sections import Report

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.report", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
)


def markdown_text(text: object) -> str:
    """Text from the database made inert in Markdown (no HTML, no table breaks, no emphasis, no links)."""
    return (html.escape("" if text is None else str(text), quote=False).replace("|", r"\|").replace("`", r"\`")
            .replace("*", r"\*").replace("[", r"\[").replace("\n", " "))


def markdown_code(text: object) -> str:
    """Text for a Markdown code span: backticks removed (they would end it)."""
    return str(text).replace("`", "")


def markdown_anchor(title: str) -> str:
    """The anchor Markdown viewers (GitHub, GitLab) give a heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def base64_text(data: bytes) -> str:
    """``data`` as base64 text (a PNG embedded in the HTML page)."""
    return base64.b64encode(data).decode("ascii")


ENVIRONMENT.filters.update(md=markdown_text, md_code=markdown_code, md_anchor=markdown_anchor, b64=base64_text)


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page: figures embedded, inline CSS, no external resource."""
    return ENVIRONMENT.get_template("report.html.j2").render(report=report)


def render_markdown(report: Report) -> str:
    """The report as Markdown, linking its figures as ``figures/<name>.png``."""
    # Every block ends with a blank line; the file ends with one newline.
    return ENVIRONMENT.get_template("report.md.j2").render(report=report).rstrip("\n") + "\n"
