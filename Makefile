# The two commands of README.md (demo, test), run as root on Debian 12, and the developer's loop (check).
.PHONY: demo check test stop

demo:
	scripts/demo

# Everything that needs no cluster (tests/unit, tests/db on SQLite, pyflakes): about a minute (goal: under one), no lock.
check:
	scripts/check

# The whole suite (CI's command): every kind on SQLite, the database tests again on PostgreSQL, the faults.
test:
	TCO_TEST_DB=$${TCO_TEST_DB:-both} scripts/test

stop:
	scripts/services stop
