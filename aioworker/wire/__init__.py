"""What a second process must agree on: messages, endpoints, CURVE security, the client and the
admin client. Torch-free."""
