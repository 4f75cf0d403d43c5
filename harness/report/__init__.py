"""``growbench report``: sections built once as data, rendered to HTML and Markdown, with their figures.

- :mod:`.build`: :func:`~.build.build_report`, the entry point (reads the database, writes every file);
- :mod:`.sections`: the report as data (sections of paragraphs, tables, lists, figures);
- :mod:`.render`: the Jinja2 templates (``templates/``) that turn it into HTML and Markdown;
- :mod:`.answers`: the first screen, one plain answer per kind of data (grow or not, by how much, how sure);
- :mod:`.advice`: the plain-language advice per regime;
- :mod:`.sweep`: the growth sweep's sections; :mod:`.training`: the training section, with
  :mod:`.train_runs` (tables and curves) and :mod:`.train_verdict` (the targets);
- :mod:`.figures`: the figures, one module per family; :mod:`.output`: figure and data files;
- :mod:`.names`, :mod:`.wording`: how strategies and numbers are written.
"""
