"""The findings document of a study: `data` (store → plain model), `plots` (SVG), `markdown`, `html`."""
