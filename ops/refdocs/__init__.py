"""The generated reference pages (ops/docs_reference.py runs them): the job file, the command line
and the metrics, each read from the code it documents."""
