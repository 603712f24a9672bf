"""The operator's console (docs/console.md): pure view models and HTML for each page, sign-in
sessions and CSRF tokens, and the assets the pages load. The HTTP shell that serves it under
`/console/` is `extproc/flows/console.py`; every change it makes goes through the same parts the
admin API and the CLI call."""
