"""The documentation, shipped inside the installed package as `loradoctor.docs` (read with `loradoctor docs`)."""
