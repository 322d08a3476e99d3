"""The artifact contract in code (artifacts/README.md): graph input/output names and the model kinds.

Standard library only, so the exporter (model/, with torch) and the server (service/, without) import
the same definitions; nothing here imports the rest of service/.
"""
