"""The project's tools, by purpose (tools/README.md is the index). Each script runs as a module from
the repository root, ``python -m tools.<folder>.<name>``, so the scripts import one another as a
package."""
