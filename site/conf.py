"""Sphinx configuration of the course's static site (`make site`; site/build.py writes the pages it reads).

MyST-NB renders the executed lessons (nothing is executed here: build.py ran them), sphinx-book-theme lays
them out with the lessons in order in the sidebar and previous/next links; both are pip packages, and nothing
is fetched while building.
"""

project = "Fast Transformer training with PyTorch"
author = "the course's authors"
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {"show_navbar_depth": 1, "home_page_in_toc": True,
                      "secondary_sidebar_items": []}  # the width goes to the code, not an on-page toc
html_static_path = ["_static"]
html_css_files = ["course.css"]  # code at its full width (110 characters), prose at a reading width
nb_execution_mode = "off"  # the pages hold the outputs of build.py's run on this machine
nb_output_stderr = "remove"  # warnings and library logs (the profiler's) are not the lesson
nb_render_markdown_format = "gfm"  # tables printed by the lessons (helpers.core.tables) are GitHub-flavoured
myst_enable_extensions = ["dollarmath"]
exclude_patterns = ["**.ipynb_checkpoints"]
# A lesson links to the course's files (../docs/claims.md, ../course/solutions/): those live in the
# repository, not in the site; leave such links as they are instead of warning for each.
suppress_warnings = ["myst.xref_missing", "myst.header", "misc.highlighting_failure"]
# Widgets (lesson 01's attention explorer) are drawn by @jupyter-widgets/html-manager served from this site
# (site/_static/html-manager/: see its README), not from a CDN: a page's widgets render offline. Its embed.js
# bundles the ipywidgets 8 and 7 controls and needs no RequireJS.
nb_ipywidgets_js = {"html-manager/embed.js": {}}
