"""Names the dead-code check (vulture, ``make lint``) must count as used: its false positives, nothing else.

Vulture matches names, not objects: a name used anywhere in the checked packages counts as used everywhere,
so an entry below also hides any other definition of that name. Keep entries few and say why each one is
here; dead code is deleted, not listed. FastAPI routes and exception handlers need no entry: the Makefile
passes ``--ignore-decorators '@app.*,@router.*'``. Names in ``__all__`` count as used (vulture's rule).
This file is only parsed by vulture, never imported (hence ``_``, as ``vulture --make-whitelist`` writes it).
"""

# ruff: noqa: B018, F821

# Signatures a protocol fixes, whose last arguments the implementation does not read.
_.tb  # Transaction.__exit__(exc_type, exc, tb) (superfile/table/writer.py)
_.signum  # the builder's signal handler, on_signal(signum, frame) (superfile_builder/__main__.py)

# Methods a framework calls by name.
_.collect  # prometheus_client's registry: a custom collector's samples, at each scrape (superfile/telemetry.py)
_.streamWriter  # pyspark.sql.datasource.DataSource: the streaming sink (superfile_ingest/datasource.py)
_.onQueryStarted  # pyspark StreamingQueryListener callbacks (superfile_ingest/metrics.py)
_.onQueryProgress
_.onQueryIdle
_.onQueryTerminated
_.on_header  # httptools' parser callbacks: one answer's parts (superfile/search/transport.py)
_.on_headers_complete
_.on_body
_.on_message_complete

# Called by Python itself.
_.__getattr__  # a module's __getattr__ (PEP 562): superfile_gateway imports its names on first use (__init__.py)

# Attributes a library reads.
_.model_config  # pydantic: the strict, extra="forbid" request models (superfile_gateway/models.py)
_.should_exit  # uvicorn.Server polls it to stop (superfile_gateway/server.py)

# Fields read by name through getattr.
_.consumed_offset  # TableGauges: BuilderMetrics exports each field as a gauge (superfile_builder/metrics.py)
_.table_bytes
_.lose  # Faults: the proxy rolls each kind in _KINDS with getattr (superfile_suite/faults.py)
_.truncate
_.refuse
_.cut_upload

# Used outside the checked packages: by a benchmark or a test that is about something else.
_.default_nprobe  # VectorIndex: bench/vector_index_bench.py sweeps nprobe around it
_.endpoint  # FaultyHttpProxy: the address the fault tests connect through (superfile_suite is their tool)
_.wait_idle  # Maintenance: the only way a test knows the background thread is done (test_maintenance.py)
