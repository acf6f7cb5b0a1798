"""The multi-stage runtime: stage processes and the orchestrator that moves
requests through them (docs/design.md §1, its engine floors). Importing this
package is cheap: its modules load on demand."""
