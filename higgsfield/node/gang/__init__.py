"""The run's nodes acting as one: the slot queue, gang admission, and the coordinator's wire."""
