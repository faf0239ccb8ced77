"""Small data sets shipped inside the package, for the demo and the examples (no download
at run time). See README.md in this folder for their sources and licenses."""
