"""The user's project as the control side sees it: scaffolding a new one, and finding its experiments."""
