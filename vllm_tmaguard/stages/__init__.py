"""The full run's stages and the preview that runs them without acting: imported only where no verdict
is cached (docs/design.md §4). Nothing outside this wing imports it but the guard, once, lazily."""
