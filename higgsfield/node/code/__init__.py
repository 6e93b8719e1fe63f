"""The deployed code and the environment it runs in: releases, the image or the project venv."""
