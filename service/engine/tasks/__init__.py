"""The served tasks, one folder each: the service a model of the task gets, its job and its decoding."""
