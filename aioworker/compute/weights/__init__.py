"""A rank's weights after loading: staged updates, commit and rollback, memory release and
resume, CUDA IPC handles."""
