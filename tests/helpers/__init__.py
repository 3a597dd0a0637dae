"""What the tests share, apart from fixtures (those live in the conftest.py files):
builders, waits and assertions. A test module imports from here, never from a
conftest.py or from another test module."""
