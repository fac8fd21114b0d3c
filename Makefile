# The two commands of README.md. Both run as root on Debian 12.
.PHONY: demo test stop

demo:
	scripts/demo

test:
	TCO_TEST_DB=$${TCO_TEST_DB:-both} scripts/test

stop:
	scripts/services stop
