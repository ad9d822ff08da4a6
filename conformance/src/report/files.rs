//! Writing the report's three renderings into a directory.

use std::path::{Path, PathBuf};

use super::Report;

impl Report {
    /// Writes `report.json`, `report.md` and `report.html` into `dir` (created if missing) and
    /// returns their paths in that order.
    ///
    /// # Errors
    /// Any I/O error creating the directory or writing a file.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<[PathBuf; 3]> {
        std::fs::create_dir_all(dir)?;
        let paths = [
            dir.join("report.json"),
            dir.join("report.md"),
            dir.join("report.html"),
        ];
        std::fs::write(&paths[0], self.to_json())?;
        std::fs::write(&paths[1], self.to_markdown())?;
        std::fs::write(&paths[2], self.to_html())?;
        Ok(paths)
    }
}
