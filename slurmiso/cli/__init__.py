"""Command-line front ends; ``main`` dispatches to one module per subcommand."""
